"""Rotary position embedding in the rotate-half layout used by Llama, Qwen and Phi checkpoints.

Band f pairs dimensions f and f + D/2 and turns them by the angle p·ω_f at position p. Rotating by −p
undoes it exactly, which is how calibration recovers pre-RoPE queries from the ones attention sees.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rope_inv_freq(head_dim: int, base: float = 10000.0) -> Tensor:
    """ω_f = base^(−2f/D) for f < D/2: the standard RoPE frequencies (float64)."""
    return 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def apply_rope(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Rotate x [..., t, D] to positions [..., t] (negative positions rotate back)."""
    angle = positions.unsqueeze(-1).double() * inv_freq.double().to(positions.device)
    cos = torch.cat([angle.cos(), angle.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angle.sin(), angle.sin()], dim=-1).to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def unrotate(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Undo RoPE: the pre-RoPE vectors of x [..., t, D] seen at positions [..., t]."""
    return apply_rope(x, -positions, inv_freq)
