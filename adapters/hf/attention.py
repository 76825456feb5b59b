"""Attention functions registered with transformers' AttentionInterface (no patching of model code).

Each wraps one inner implementation (sdpa, flash-attention-2, or eager, the plain formula) and, when the
forward carries ``kvbench_cache=...``, hands the cache the layer's post-RoPE queries and, for policies
that observe every step, the new queries' attention probabilities. The attention output itself always
comes from the inner implementation, so every policy decodes with the same numerics.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, flash_attention_mask, sdpa_mask

INNER = ("sdpa", "eager", "flash_attention_2")
_MASKS: dict[str, Callable[..., Any]] = {
    "sdpa": sdpa_mask,
    "eager": eager_mask,
    "flash_attention_2": flash_attention_mask,
}


def kvbench_attention_name(inner: str) -> str:
    """Register (once) and return the attention implementation name that wraps ``inner``."""
    if inner not in INNER:
        raise ValueError(f"unknown attention implementation {inner!r}; use one of {', '.join(INNER)}")
    name = f"kvbench_{inner}"
    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, functools.partial(_attention, inner=inner))
        AttentionMaskInterface.register(name, _MASKS[inner])
    return name


def causal_probabilities(query: Tensor, key: Tensor, scaling: float) -> Tensor:
    """softmax(q·kᵀ·scaling) [B, Hq, q, S] for q new queries at the end of S cached keys, in fp32."""
    q_heads, q_len = query.shape[1], query.shape[2]
    group = q_heads // key.shape[1]
    keys = key.float().repeat_interleave(group, dim=1)  # [B, Hq, S, D]
    logits = query.float() @ keys.transpose(-1, -2) * scaling  # [B, Hq, q, S]
    slots = key.shape[2]
    visible = (
        torch.arange(slots, device=query.device)
        <= torch.arange(slots - q_len, slots, device=query.device)[:, None]
    )
    return logits.masked_fill(~visible, float("-inf")).softmax(dim=-1)


def _attention(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    *,
    inner: str,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    cache = kwargs.pop("kvbench_cache", None)
    scaling = kwargs.get("scaling") or 1.0 / math.sqrt(query.shape[-1])
    probs = None
    if cache is not None:
        cache.record_queries(module.layer_idx, query)
        if cache.observes_attention:
            probs = causal_probabilities(query, key, scaling)
            cache.observe_attention(module.layer_idx, probs)
    if inner == "eager":
        probs = probs if probs is not None else causal_probabilities(query, key, scaling)
        values = value.float().repeat_interleave(query.shape[1] // value.shape[1], dim=1)
        output = (probs @ values).to(query.dtype)  # [B, Hq, q, D]
        return output.transpose(1, 2).contiguous(), probs
    if inner == "sdpa":
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    from transformers.integrations.flash_attention import flash_attention_forward

    return flash_attention_forward(module, query, key, value, attention_mask, **kwargs)
