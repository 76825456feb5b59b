"""R-KV as in its repository (Zefan-Cai/R-KV, ``R1KV.update_kv`` and ``cal_similarity``), ported as
the Random Attention code runs it (``rkv_official``).

importance = window_attention(last 8 queries, group=max of logits before softmax, pool=max7)
redundancy: per KV head, cosine similarities c[i, j] of the candidate keys, diagonal zeroed; in each row
i the entry of the newest j with c[i, j] > 0.5 is zeroed too (j = 0 when the row has none), so the newest
member of a near-duplicate cluster loses its in-cluster similarity and is the one kept; then the column
mean (divided by n) and a softmax over the slots.
score = λ·importance − (1 − λ)·redundancy

Recorded choices: λ = 0.1 (the R-KV README and the Random Attention runs; the repository's code default
is 0.07); scores over the candidates only (every slot but the buffer), as in the Random Attention port;
the j = 0 quirk for rows without a near-duplicate is kept for fidelity (under prompt protection slot 0 is
protected anyway).

See docs/policies.md#rkv-official (every built-in policy's math, sources and recorded choices).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kvbench.core.contract import EvictionView, Policy, policy
from kvbench.policies.scoring import heads_per_chunk, key_similarity_rows, window_attention


def thresholded_redundancy(keys: Tensor, threshold: float) -> Tensor:
    """R-KV's redundancy [B, Hkv, n] (see the module docstring), in chunks of rows of a few KV heads at a
    time, so that no similarity block outgrows CHUNK_BYTES (kvbench.policies.scoring)."""
    batch, heads, n, dim = keys.shape
    flat = keys.reshape(batch * heads, 1, n, dim)
    column_sums = torch.zeros(batch * heads, n, dtype=torch.float32, device=keys.device)
    one_based = torch.arange(1, n + 1, device=keys.device, dtype=torch.int16 if n < 2**15 else torch.int32)
    group = heads_per_chunk(ROWS * n)
    for first in range(0, batch * heads, group):
        for start, cos in key_similarity_rows(flat[first : first + group], chunk=ROWS):  # [g, 1, c, n]
            rows = torch.arange(cos.shape[2], device=keys.device)
            cos[:, :, rows, rows + start] = 0.0
            newest_similar = ((cos > threshold) * one_based).amax(dim=-1, keepdim=True)  # 0: none
            cos.scatter_(-1, (newest_similar.long() - 1).clamp(min=0), 0.0)
            column_sums[first : first + group] += cos.sum(dim=2)[:, 0]
    return (column_sums.view(batch, heads, n) / n).softmax(dim=-1)


ROWS = 256  # similarity rows per block: the column sums add up in blocks of this many rows


@policy("rkv-official", needs={"queries"})
class RKVOfficial(Policy):
    """R-KV (repository variant): 8-query max-pooled importance minus thresholded redundancy, λ = 0.1."""

    lam: float = 0.1
    """λ in λ·importance − (1 − λ)·redundancy."""
    window: int = 8
    threshold: float = 0.5

    @property
    def query_window(self) -> int:
        return self.window

    def score(self, view: EvictionView) -> Tensor:
        importance = window_attention(view.queries[:, :, -self.window :], view.keys, pool="max7", group="max")
        redundancy = thresholded_redundancy(view.keys, self.threshold)
        return self.lam * importance - (1.0 - self.lam) * redundancy
