"""kvpress's own side of the parity test: run by tests/kvpress_presses/test_parity.py under the kvpress venv.

A real transformers Qwen3 (tiny-qwen3's shape, seeded weights, transformers as kvpress pins it) reads T
seeded tokens; at layer 1 the hook takes what the attention layer saw (the real module, its input hidden
states, its position embeddings) and the cache's keys and values. For each press given, kvpress's own
``compress()`` keeps n tokens; the kept positions are found by matching the kept keys against the
cache's. The tensors kvbench's engine will see at the same event are written beside them: the cached keys
and values, the post-RoPE queries of the last W tokens, as kvbench's attention function records them, and
the layer's output projection weights.

    python press_side.py OUT.safetensors OUT.json T KEEP SEED PRESS[:k=v,...] ...
"""

from __future__ import annotations

import json
import sys

import torch
from kvpress.presses.decoding_press import DecodingPress
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from kvbench.kvpress.child import _built, scorer_presses

LAYER = 1


def main(out_tensors: str, out_json: str, tokens: int, keep: int, seed: int, presses: list[str]) -> None:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rope_theta=10000.0, max_position_embeddings=4096,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    seen: dict[str, object] = {}

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        seen.update(module=module, hidden=kwargs["hidden_states"], pe=kwargs["position_embeddings"])

    attention = model.model.layers[LAYER].self_attn
    attention.rotary_emb = model.model.rotary_emb  # as kvpress's BasePress.__call__ sets it on every layer
    attention.register_forward_hook(hook, with_kwargs=True)
    ids = torch.randint(0, 256, (1, tokens), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(ids, use_cache=True)
    layer = out.past_key_values.layers[LAYER]
    keys, values = layer.keys, layer.values
    hidden, (cos, sin) = seen["hidden"], seen["pe"]
    module = seen["module"]
    # the post-RoPE queries of every token, as the attention function receives them
    shape = (1, tokens, -1, module.head_dim)
    query = module.q_norm(module.q_proj(hidden).view(shape)).transpose(1, 2)
    query, _ = apply_rotary_pos_emb(query, query, cos, sin)
    kept: dict[str, list[list[int]]] = {}
    windows: dict[str, int] = {}
    found = scorer_presses()
    for text in presses:
        name, _, rest = text.partition(":")
        raw = dict(item.split("=", 1) for item in rest.split(",") if item)
        press, _, feed, window = _built(found[name], raw)
        windows[text] = window
        if feed == "window":  # the recent hidden states only, as at a decode-time event
            given, pe = hidden[:, -window:], (cos[:, -window:], sin[:, -window:])
        else:
            given, pe = hidden, (cos, sin)
        press.compression_ratio = DecodingPress._find_target_compression_ratio(None, tokens, keep)  # type: ignore[arg-type]
        torch.manual_seed(seed)
        with torch.no_grad():
            small, _ = press.compress(module, given, keys, values, None, {"position_embeddings": pe})
        assert small.shape[2] == keep, (text, small.shape)
        match = (small[0][:, :, None, :] == keys[0][:, None, :, :]).all(-1)  # [H, keep, T]
        assert (match.sum(-1) == 1).all(), f"{text}: a kept key matches no single cached key"
        kept[text] = match.float().argmax(-1).sort(-1).values.tolist()
    inv_freq = model.model.rotary_emb.inv_freq
    save_file(
        {"keys": keys.contiguous(), "values": values.contiguous(), "queries": query.contiguous(),
         "inv_freq": inv_freq.contiguous(), "output_projection": module.o_proj.weight.contiguous()},
        out_tensors,
    )  # fmt: skip
    with open(out_json, "w") as f:
        json.dump({"kept": kept, "windows": windows, "layer": LAYER}, f)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), a[5:])
