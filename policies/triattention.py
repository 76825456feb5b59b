"""TriAttention (WeianMao/triattention; the per-head variant the Random Attention paper compared with).

Keys are un-rotated to pre-RoPE (positions and RoPE frequencies ω_f needed) and split into complex bands
k_f. With calibrated per-query-head mean pre-RoPE query q̄_f and mean magnitude m_f (kvbench calibrate):
amp_f = |q̄_f|·|k_f|, φ_f = arg(q̄_f·conj k_f), and for a key at position p seen from position t

    score = mean over d ∈ {2⁰, …, 2¹⁶} of Σ_f amp_f·cos(ω_f(t − p + d) + φ_f) + Σ_f (m_f − |q̄_f|)·|k_f|

which estimates the future queries' attention logit to that key. Per query head the score is z-scored
over the non-prompt candidates, then maxed over the GQA group; the engine averages the layers' scores
(``layer_reduce = "mean"``) so one keep-set per KV head is shared by all layers.

Recorded choices: the mean over d is computed in closed form (cos(a + dω) = cos a·cos dω − sin a·sin dω);
t = view.step, the position of the next query; population std clamped at 1e-6 as upstream; no tie-break
noise; RoPE attention scaling is 1 (plain RoPE); calibration after q_norm (upstream skips it: a known bug).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from torch import Tensor

from kvbench.calibration import QueryStats, complex_bands
from kvbench.contract import EvictionView, Policy, policy


def unrotate(keys: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Post-RoPE keys [B, Hkv, n, D] at ``positions`` -> complex pre-RoPE bands [B, Hkv, n, D/2]."""
    angle = positions.unsqueeze(-1).double() * inv_freq.double()  # [B, Hkv, n, D/2]
    return complex_bands(keys) * torch.polar(torch.ones_like(angle), -angle).to(torch.complex64)


@policy("triattention", needs={"rope", "calibration"})
class TriAttention(Policy):
    """TriAttention: RoPE trigonometric estimate of future attention from calibrated query statistics."""

    max_offset_log2: int = 16
    layer_reduce: ClassVar[Literal["none", "mean"]] = "mean"

    def score(self, view: EvictionView) -> Tensor:
        stats: QueryStats = view.calibration
        omega = view.model.rope_inv_freq.to(view.keys.device).double()  # [F]
        offsets = 2.0 ** torch.arange(self.max_offset_log2 + 1, device=omega.device, dtype=torch.float64)
        mean_cos = torch.cos(offsets[:, None] * omega).mean(dim=0).float()  # [F]
        mean_sin = torch.sin(offsets[:, None] * omega).mean(dim=0).float()

        group = view.model.group
        k = unrotate(view.keys, view.positions, omega).repeat_interleave(group, dim=1)  # [B, Hq, n, F]
        q_mean = stats.mean[view.layer].to(k.device)[None, :, None, :]  # [1, Hq, 1, F]
        q_abs = stats.mean_abs[view.layer].to(k.device)[None, :, None, :]
        amp = q_mean.abs() * k.abs()
        phase = torch.angle(q_mean * k.conj())
        delta = (view.step - view.positions).repeat_interleave(group, dim=1).unsqueeze(-1)  # [B, Hq, n, 1]
        a = (delta.double() * omega).float() + phase
        per_head = (amp * (a.cos() * mean_cos - a.sin() * mean_sin)).sum(-1) + ((q_abs - q_mean.abs()) * k.abs()).sum(-1)

        decode = (view.positions >= view.prompt_len).repeat_interleave(group, dim=1)  # [B, Hq, n]
        # z-score over the decode candidates; a head holding only prompt slots uses all its candidates
        reference = torch.where(decode.any(dim=-1, keepdim=True), decode, torch.ones_like(decode))
        count = reference.sum(dim=-1, keepdim=True).clamp(min=1)
        mean = (per_head * reference).sum(dim=-1, keepdim=True) / count
        std = (((per_head - mean) * reference).square().sum(dim=-1, keepdim=True) / count).sqrt().clamp(min=1e-6)
        z = (per_head - mean) / std
        batch, _, n = z.shape
        return z.view(batch, view.model.num_kv_heads, group, n).amax(dim=2)
