"""A press's ``score`` arguments built from an eviction view (runs in the kvpress child's process).

kvpress presses read the layer through a few attributes: ``module.config`` (head counts), ``head_dim``,
``layer_idx``, ``q_proj``/``k_proj`` applied to ``hidden_states``, ``rotary_emb`` and, for CriticalKV,
``o_proj.weight`` (the layer's real W_O, which the engine gives a policy that needs
``output_projection``). The stand-in layer here has identity projections, so that the hidden states it is
given *are* the pre-RoPE queries (or keys) the real layer would have produced; the engine records queries
post-RoPE and caches keys post-RoPE, and rotating them back by their positions is exact for plain RoPE
(kvbench.core.rope). It is not one of
transformers' Qwen3/Gemma3/Phi3 attention classes, so kvpress applies no q/k norm again: the recorded
queries and cached keys have had it already.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor, nn

from kvbench.core.contract import EvictionView
from kvbench.core.rope import unrotate
from kvbench.kvpress.catalog import Feed


class _Rotary(nn.Module):
    """transformers' ``rotary_emb(x, position_ids) -> (cos, sin)`` [B, P, D] in the rotate-half layout."""

    def __init__(self, inv_freq: Tensor) -> None:
        super().__init__()
        self.inv_freq = inv_freq.double()

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        angle = position_ids.double().unsqueeze(-1) * self.inv_freq.to(position_ids.device)
        both = torch.cat([angle, angle], dim=-1)
        return both.cos().to(x.dtype), both.sin().to(x.dtype)


class StandInLayer(nn.Module):
    """The attributes of a Llama-like attention layer that kvpress's presses read."""

    def __init__(self, view: EvictionView) -> None:
        super().__init__()
        model = view.model
        self.layer_idx = view.layer
        self.head_dim = model.head_dim
        self.num_key_value_heads = model.num_kv_heads
        self.num_key_value_groups = model.group
        self.config = SimpleNamespace(
            num_attention_heads=model.num_q_heads,
            num_key_value_heads=model.num_kv_heads,
            head_dim=model.head_dim,
            hidden_size=model.num_q_heads * model.head_dim,
            num_hidden_layers=model.num_layers,
            _attn_implementation="sdpa",
        )
        self.q_proj = nn.Identity()
        self.k_proj = nn.Identity()
        self.rotary_emb = _Rotary(model.rope_inv_freq)
        if view.output_projection is not None:  # the layer's real W_O, for presses that weigh values by it
            weight = view.output_projection.float()
            self.o_proj = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            self.o_proj.weight = nn.Parameter(weight, requires_grad=False)
            self.config.hidden_size = weight.shape[0]


def _flat(heads_first: Tensor) -> Tensor:
    """[B, H, T, D] -> [B, T, H·D], the layout of a projection's output."""
    batch, heads, tokens, dim = heads_first.shape
    return heads_first.transpose(1, 2).reshape(batch, tokens, heads * dim)


def score_arguments(view: EvictionView, feed: Feed) -> dict[str, Any]:
    """``score``'s keyword arguments for a press fed as ``feed`` (kvbench.kvpress.catalog)."""
    module = StandInLayer(view)
    inv_freq = view.model.rope_inv_freq
    batch = view.keys.shape[0]
    kwargs: dict[str, Any] = {}
    hidden: Tensor
    if feed == "window":
        queries = view.queries.float()
        window = queries.shape[2]
        positions = torch.arange(view.step - window, view.step, device=queries.device).expand(batch, -1)
        pre = unrotate(queries, positions[:, None, :], inv_freq)
        hidden = _flat(pre)
        kwargs["position_embeddings"] = module.rotary_emb(pre, positions)
    elif feed == "prerope_keys":
        hidden = _flat(unrotate(view.keys.float(), view.positions, inv_freq))
    else:  # the cache feed: presses that read keys and values only get an empty hidden state
        hidden = view.keys.new_zeros(batch, 0, module.config.hidden_size)
    return {
        "module": module,
        "hidden_states": hidden,
        "keys": view.keys.float(),
        "values": view.values.float(),
        "attentions": None,
        "kwargs": kwargs,
    }
