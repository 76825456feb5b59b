"""TriAttention (WeianMao/triattention; the per-head variant the Random Attention paper compared with).

With calibrated per-query-head mean pre-RoPE query q̄_f and mean magnitude m_f per RoPE band f
(``kvbench calibrate``), and the key's pre-RoPE band k_f, amp_f = |q̄_f|·|k_f|, φ_f = arg(q̄_f·conj k_f):

    score(p) = mean over d ∈ {2⁰, …, 2¹⁶} of Σ_f amp_f·cos(ω_f(t − p + d) + φ_f) + Σ_f (m_f − |q̄_f|)·|k_f|

an estimate of the future queries' attention logit to the key at position p, seen from position t. Per
query head the score is z-scored over the non-prompt candidates, then maxed over the GQA group; the
engine averages the layers' scores (``layer_reduce = "mean"``) so that one keep-set per KV head is
shared by all layers.

Computation: RoPE rotates band f by ω_f·p, so amp_f·cos(ω_f(t − p + d) + φ_f) = Re(q̄_f·e^{iω_f(t+d)}·conj k̃_f)
with k̃ the cached post-RoPE key: the un-rotation cancels, |k_f| = |k̃_f|, and the mean over d is the
constant M_f = mean_d e^{iω_f d}. The trigonometric term is then one dot product of each cached key with
the rotated expected query q̄·M·e^{iωt}. The tests check this against the formula term by term.

Recorded choices: t = view.step (the position of the next query); population std clamped at 1e-6 as
upstream; no tie-break noise; RoPE attention scaling 1 (plain RoPE); calibration after q_norm (upstream
skips it: a known bug).

See docs/policies.md#triattention (every built-in policy's math, sources and recorded choices).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from torch import Tensor

from kvbench.core.calibration import QueryStats, complex_bands
from kvbench.core.contract import EvictionView, Policy, policy


@policy("triattention", needs={"rope", "calibration"})
class TriAttention(Policy):
    """TriAttention: RoPE trigonometric estimate of future attention from calibrated query statistics."""

    max_offset_log2: int = 16
    layer_reduce: ClassVar[Literal["none", "mean"]] = "mean"

    def expected_query(self, stats: QueryStats, view: EvictionView) -> Tensor:
        """q̄·M·e^{iωt} as a real rotate-half vector per query head: [Hq, D]."""
        omega = view.model.rope_inv_freq.double().to(view.keys.device)  # [F]
        offsets = 2.0 ** torch.arange(self.max_offset_log2 + 1, dtype=torch.float64, device=omega.device)
        mean_offset = torch.polar(torch.ones_like(omega), offsets[:, None] * omega).mean(dim=0)  # M_f
        w = (
            stats.mean[view.layer].to(omega.device)
            * mean_offset
            * torch.polar(torch.ones_like(omega), view.step * omega)
        )
        return torch.cat([w.real, w.imag], dim=-1).float()

    def score(self, view: EvictionView) -> Tensor:
        stats: QueryStats = view.calibration
        _, kv_heads, _, dim = view.keys.shape
        group = view.model.group
        keys = view.keys.float()
        query = self.expected_query(stats, view).view(kv_heads, group, dim)
        trig = torch.einsum("bhnd,hgd->bhgn", keys, query)  # Σ_f Re(w_f·conj k̃_f)
        spread = (stats.mean_abs[view.layer] - stats.mean[view.layer].abs()).to(keys.device)
        extra = torch.einsum("bhnf,hgf->bhgn", complex_bands(keys).abs(), spread.view(kv_heads, group, -1))
        per_head = trig + extra  # [B, Hkv, G, n]

        # z-score over the decode candidates; a head holding only prompt slots uses all its candidates
        decode = (view.positions >= view.prompt_len).unsqueeze(2)  # [B, Hkv, 1, n]
        reference = torch.where(decode.any(dim=-1, keepdim=True), decode, torch.ones_like(decode)).float()
        count = reference.sum(dim=-1, keepdim=True)
        mean = (per_head * reference).sum(dim=-1, keepdim=True) / count
        std = (
            (((per_head - mean) * reference).square().sum(dim=-1, keepdim=True) / count)
            .sqrt()
            .clamp(min=1e-6)
        )
        return ((per_head - mean) / std).amax(dim=2)
