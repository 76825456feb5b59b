"""Shared scoring helpers, so that each policy file reads like its paper's equation.

Shapes: B batch rows, Hkv KV heads, G query heads per KV head, W recent queries, n candidates, D head dim.
Every helper returns float32.

The helpers' formulas: docs/policies.md#shared-helpers.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from kvbench.core.contract import EvictionView

Pool = Literal["avg5", "max7", "none"]
GroupReduce = Literal["mean", "max"]


def pool_slots(scores: Tensor, pool: Pool) -> Tensor:
    """1-D pooling along the slot axis: ``avg5`` (kernel 5, padding 2, zeros counted) or ``max7``."""
    if pool == "none":
        return scores
    shape = scores.shape
    flat = scores.reshape(-1, 1, shape[-1])
    if pool == "avg5":
        flat = F.avg_pool1d(flat, kernel_size=5, stride=1, padding=2, count_include_pad=True)
    elif pool == "max7":
        flat = F.max_pool1d(flat, kernel_size=7, stride=1, padding=3)
    else:
        raise ValueError(f"unknown pooling {pool!r}; use avg5, max7 or none")
    return flat.reshape(shape)


CHUNK_BYTES = 4 << 20
"""The most one chunk of an n-wide intermediate (logits, similarities) holds: a few MiB, which stay in the
CPU's caches. A whole batch's [B, Hkv, G, W, n] logits are hundreds of MiB at B = 16 and K = 2048, which
the allocator maps anew at each event and the kernel zeroes page by page before the softmax reads them
again from memory; row by row the values are the same (each row is its own matrix product)."""


class Scratch:
    """Buffers that one call reuses for each of its chunks. A fresh buffer of a few MiB is mapped anew and
    zeroed page by page by the kernel: at K = 2048 an elementwise op on one chunk of keys cost as much
    in page faults as in arithmetic."""

    def __init__(self) -> None:
        self.held: dict[str, Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        count = math.prod(shape)
        buffer = self.held.get(name)
        if buffer is None or buffer.numel() < count or buffer.dtype != dtype or buffer.device != device:
            buffer = self.held[name] = torch.empty(count, dtype=dtype, device=device)
        return buffer[:count].view(shape)


def heads_per_chunk(floats_per_head: int) -> int:
    """How many (batch row, KV head) pairs one chunk takes when each holds ``floats_per_head`` fp32 values."""
    return max(1, CHUNK_BYTES // (4 * max(floats_per_head, 1)))


def window_attention(
    queries: Tensor, keys: Tensor, pool: Pool = "avg5", group: GroupReduce = "mean"
) -> Tensor:
    """Attention of the recent queries to the candidates, averaged over the window: [B, Hkv, n].

    queries [B, Hq, W, D], keys [B, Hkv, n, D]. Softmax over the candidates only, in fp32.
    ``group="mean"``: softmax per query head, mean over W, pool, mean over the GQA group.
    ``group="max"``: max of the logits over the group, then softmax, mean over W, pool.
    Computed a few (batch row, KV head) pairs at a time (CHUNK_BYTES).
    """
    batch, q_heads, window, dim = queries.shape
    kv_heads, n = keys.shape[1], keys.shape[2]
    group_size = q_heads // kv_heads
    q = queries.float().reshape(batch * kv_heads, group_size, window, dim)  # [B·Hkv, G, W, D]
    k = keys.float().reshape(batch * kv_heads, n, dim)
    probs = q.new_empty(batch * kv_heads, 1 if group == "max" else group_size, n)
    step = heads_per_chunk(group_size * window * n)
    for start in range(0, batch * kv_heads, step):
        part = slice(start, start + step)
        logits = torch.einsum("cgwd,cnd->cgwn", q[part], k[part]).div_(math.sqrt(dim))  # [c, G, W, n]
        if group == "max":
            probs[part, 0] = logits.amax(dim=1).softmax(dim=-1).mean(dim=1)
        else:
            probs[part] = logits.softmax(dim=-1).mean(dim=2)
    pooled = pool_slots(probs.view(batch, kv_heads, -1, n), pool)
    return pooled[:, :, 0] if group == "max" else pooled.mean(dim=2)


def value_range(values: Tensor) -> Tensor:
    """max − min over the head dimension, per slot: [B, Hkv, n]."""
    v = values.float()
    return v.amax(dim=-1) - v.amin(dim=-1)


def key_redundancy(keys: Tensor) -> Tensor:
    """Mean cosine similarity of each key to the other candidates, softmaxed over slots: [B, Hkv, n].

    The row mean of the cosine matrix with its diagonal zeroed, divided by n, is (u_i·Σ_j u_j − u_i·u_i)/n
    for unit keys u = k/max(|k|, ε) (F.normalize's): u_i·Σ_j u_j = (k_i·Σ_j k_j/max(|k_j|, ε))/max(|k_i|, ε),
    so the keys are read three times (norms, Σ_j u_j, the products) and neither the unit keys nor an n×n
    matrix is ever written; equal to the matrix form (tested).
    """
    batch, heads, n, dim = keys.shape
    flat = keys.reshape(batch * heads, n, dim)
    row_sums = keys.new_empty(batch * heads, n, dtype=torch.float32)
    step = heads_per_chunk(n * dim)  # a few KV heads at a time, as window_attention
    for start in range(0, batch * heads, step):
        part = flat[start : start + step].float()  # [c, n, D]
        norms = torch.linalg.vector_norm(part, dim=-1, keepdim=True)
        inverse = norms.clamp_min(1e-12).reciprocal()
        total = torch.bmm(inverse.mT, part)  # Σ_j u_j: [c, 1, D]
        to_total = torch.bmm(part, total.mT) * inverse
        row_sums[start : start + step] = (to_total - (norms * inverse).square())[..., 0]
    return (row_sums.view(batch, heads, n) / n).softmax(dim=-1)


def gaussian_projection(view: EvictionView, rank: int) -> Tensor:
    """G ~ N(0, 1)/sqrt(r) of shape [B, D, r], one per batch row, from the view's generators."""
    return view.normal(view.keys.shape[-1], rank) / math.sqrt(rank)


def leverage(x: Tensor, projection: Tensor) -> Tensor:
    """||x·G||² per slot: x [B, Hkv, n, D], G [B, D, r] -> [B, Hkv, n]."""
    sketch = torch.einsum("bhnd,bdr->bhnr", x.float(), projection)
    return sketch.square().sum(dim=-1)


def gumbel_topk(weights: Tensor, view: EvictionView) -> Tensor:
    """Scores whose top-k is a weighted sample without replacement from ``weights`` [B, Hkv, n] (>= 0).

    log(w) + Gumbel noise. Zero weights get -1e4 + Gumbel noise instead of -inf: they stay selectable
    (drawn uniformly, after every positive weight, since log of the smallest fp32 is about -104).
    """
    noise = view.gumbel(*weights.shape[1:])
    w = weights.float()
    positive = w > 0
    log_w = torch.where(
        positive, w.clamp(min=torch.finfo(torch.float32).tiny).log(), torch.full_like(w, -1e4)
    )
    return log_w + noise
