"""kvbench calibrate: pre-RoPE queries (after q_norm) recovered exactly from what attention sees."""

from __future__ import annotations

import torch

from kvbench.adapters.hf.calibrate import BUILTIN_CORPUS, calibrate, corpus_text
from kvbench.adapters.hf.models import LoadedModel


def test_layer0_statistics_equal_a_direct_computation(tiny: LoadedModel) -> None:
    stats = calibrate(tiny, max_tokens=300)
    assert stats.corpus == BUILTIN_CORPUS and stats.tokens == 300 and stats.model == "tiny-qwen3"
    assert stats.mean.shape == (2, 4, 8) and stats.mean_abs.shape == (2, 4, 8)

    # layer 0's pre-RoPE queries depend on the tokens only: q_norm(q_proj(input_layernorm(embed(x))))
    _, text = corpus_text(None)
    ids = torch.tensor(tiny.tokenizer(text, add_special_tokens=False)["input_ids"][:300])
    layer = tiny.model.model.layers[0]
    with torch.no_grad():
        hidden = layer.input_layernorm(tiny.model.model.embed_tokens(ids))
        q = layer.self_attn.q_norm(layer.self_attn.q_proj(hidden).view(300, 4, 16)).transpose(
            0, 1
        )  # [Hq, T, D]
    bands = torch.complex(q[..., :8], q[..., 8:])
    assert torch.allclose(stats.mean[0], bands.mean(dim=1), atol=1e-5)
    assert torch.allclose(stats.mean_abs[0], bands.abs().mean(dim=1), atol=1e-5)
