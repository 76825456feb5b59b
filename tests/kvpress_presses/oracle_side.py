"""kvpress's own decoding-time compression, generating greedily: the oracle side of test_oracle.py.

Run under the kvpress venv. It loads the checkpoint kvbench converted from the embedded model's GGUF file
(transformers as kvpress pins it), wraps a ScorerPress in kvpress's ``DecodingPress(base_press,
compression_interval, target_size)`` and decodes greedily with the loop of kvpress's own pipeline
(``KVPressTextGenerationPipeline.generate_answer``: explicit position ids, the cache the press compresses
in place). It writes the generated token ids and the cache length of layer 0 after every compression,
for kvpress's compress() as it is and for a diagnostic variant that keeps the same tokens in slot order.

    python oracle_side.py CHECKPOINT PROMPT_IDS.json PRESS INTERVAL TARGET NEW_TOKENS OUT.json MODE...

MODE: ``kvpress`` (its compress() as it is) or ``chronological`` (the diagnostic variant).
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from typing import Any

import kvpress
import torch
from transformers import AutoModelForCausalLM, DynamicCache


def _chronological(press: Any) -> None:
    """A diagnostic variant: the base press's compress() with its kept indices in slot order (kvbench's
    compaction order) instead of top-k's score order; the same tokens kept, only their order differs."""
    from kvpress.utils import compute_n_kept

    def compress(module, hidden_states, keys, values, attentions, kwargs):  # type: ignore[no-untyped-def]
        if press.compression_ratio == 0:
            return keys, values
        scores = press.score(module, hidden_states, keys, values, attentions, kwargs)
        n_kept = compute_n_kept(keys.shape[2], press.compression_ratio)
        index = scores.topk(n_kept, dim=-1).indices.sort(dim=-1).values
        index = index.unsqueeze(-1).expand(-1, -1, -1, module.head_dim)
        return keys.gather(2, index).contiguous(), values.gather(2, index).contiguous()

    press.compress = compress


def generate(model: Any, prompt: torch.Tensor, press: Any, new: int) -> dict[str, list[int]]:
    """kvpress's pipeline's greedy loop under ``press``; the tokens, and at each compression of layer 0
    the length it left and how many of the ``compression_interval`` most recent tokens (kvbench's buffer,
    never evicted there) it dropped, over the KV heads."""
    lengths: list[int] = []
    recent_dropped: list[int] = []
    compress = press.compress
    recent = press.compression_interval

    def counted(module, hidden_states, keys, values, attentions, kwargs):  # type: ignore[no-untyped-def]
        kept = compress(module, hidden_states, keys, values, attentions, kwargs)
        if module.layer_idx == 0 and kept[0].shape[2] < keys.shape[2]:
            lengths.append(int(kept[0].shape[2]))
            last = keys[0, :, -recent:]  # [H, B, D] against the kept [H, T, D]
            present = (last[:, :, None, :] == kept[0][0][:, None, :, :]).all(-1).any(-1)
            recent_dropped.append(int((~present).sum()))
        return kept

    press.compress = counted
    tokens: list[int] = []
    with torch.no_grad(), press(model):
        cache = DynamicCache()
        length = prompt.shape[1]
        positions = torch.arange(length)[None]
        logits = model(input_ids=prompt, past_key_values=cache, position_ids=positions).logits
        tokens.append(int(logits[0, -1].argmax()))
        for i in range(new - 1):
            position = torch.tensor([[length + i]])
            step = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, position_ids=position)
            tokens.append(int(step.logits[0, -1].argmax()))
    return {"tokens": tokens, "compressed_to": lengths, "recent_dropped": recent_dropped}


def main(
    checkpoint: str,
    ids_file: str,
    name: str,
    interval: int,
    target: int,
    new: int,
    out: str,
    modes: list[str],
) -> None:
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with open(ids_file) as f:
        prompt = torch.tensor([json.load(f)])
    found: dict[str, Any] = {"kvpress": version("kvpress")}
    for mode in modes:
        base = getattr(kvpress, name)()
        if mode == "chronological":
            _chronological(base)
        press = kvpress.DecodingPress(base_press=base, compression_interval=interval, target_size=target)
        found[mode] = generate(model, prompt, press, new)
    with open(out, "w") as f:
        json.dump(found, f)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5]), a[6], a[7:])
