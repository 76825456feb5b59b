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

import functools

import torch
from torch import Tensor

from kvbench.core.contract import EvictionView, WindowedPolicy, policy
from kvbench.policies.near_duplicates import newest_near_duplicates
from kvbench.policies.scoring import Scratch, heads_per_chunk, window_attention


def thresholded_redundancy(keys: Tensor, threshold: float, scratch: Scratch | None = None) -> Tensor:
    """R-KV's redundancy [B, Hkv, n] (see the module docstring). A column sum of the cosine matrix is
    u_j·Σ_i u_i, less the diagonal and the entry each row zeroes: O(n·D) given each row's newest
    near-duplicate (kvbench.policies.near_duplicates); a few KV heads at a time, as window_attention, in
    buffers that ``scratch`` keeps from one call to the next."""
    batch, heads, n, dim = keys.shape
    flat = keys.reshape(batch * heads, n, dim)
    column_sums = flat.new_empty(batch * heads, n, dtype=torch.float32)
    step, scratch = heads_per_chunk(n * dim), scratch or Scratch()
    for first in range(0, batch * heads, step):
        part = flat[first : first + step]
        norms = torch.linalg.vector_norm(part, dim=-1, keepdim=True, dtype=torch.float32)
        unit = scratch.take("unit", part.shape, torch.float32, part.device)
        torch.div(part, norms.clamp_min(1e-12), out=unit)  # F.normalize, into a buffer every chunk reuses
        # u_j·Σu and u_j·u_0 in one pass: a row with no near-duplicate zeroes its slot 0 instead
        sums, to_first = torch.bmm(unit, torch.stack([unit.sum(dim=1), unit[:, 0]], dim=-1)).unbind(-1)
        sums = sums - (norms[..., 0] > 0).float()
        newest, similarity = newest_near_duplicates(unit, threshold, scratch)
        entries = torch.where(newest >= 0, similarity, to_first)
        entries[:, 0].masked_fill_(newest[:, 0] < 0, 0.0)  # row 0's slot 0 is its diagonal, left out
        column_sums[first : first + step] = sums.scatter_add_(1, newest.clamp(min=0), -entries)
    return (column_sums.view(batch, heads, n) / n).softmax(dim=-1)


@policy("rkv-official", needs={"queries"})
class RKVOfficial(WindowedPolicy):
    """R-KV (repository variant): 8-query max-pooled importance minus thresholded redundancy, λ = 0.1."""

    lam: float = 0.1
    """λ in λ·importance − (1 − λ)·redundancy."""
    window: int = 8
    threshold: float = 0.5

    @functools.cached_property
    def _scratch(self) -> Scratch:
        return Scratch()  # one per policy, reused at every event (not a parameter: a cache)

    def score(self, view: EvictionView) -> Tensor:
        importance = window_attention(self.recent_queries(view), view.keys, pool="max7", group="max")
        redundancy = thresholded_redundancy(view.keys, self.threshold, self._scratch)
        return self.lam * importance - (1.0 - self.lam) * redundancy
