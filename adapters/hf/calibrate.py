"""``kvbench calibrate``: TriAttention's query statistics from a model reading a calibration text.

The attention functions already see every post-RoPE query (after q_norm where the model has one); the
queries of a token at position p are rotated back by −p·ω to pre-RoPE, which is exact for plain RoPE.
The text is the shipped calibration prose (suite/data/calibration.txt) unless another file is given: it
must never be a test set, and its name is recorded in the statistics file.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import torch

from kvbench.adapters.hf.cache import cache_argument, make_cache
from kvbench.adapters.hf.models import LoadedModel
from kvbench.core.calibration import QueryStats
from kvbench.core.rope import unrotate
from kvbench.core.schedule import Schedule
from kvbench.registry import make_policy

BUILTIN_CORPUS = "kvbench:data/calibration.txt"


def corpus_text(path: Path | None) -> tuple[str, str]:
    """(name, text) of the calibration corpus."""
    if path is None:
        return BUILTIN_CORPUS, files("kvbench").joinpath("data/calibration.txt").read_text()
    return str(path), path.read_text()


@torch.inference_mode()
def calibrate(
    loaded: LoadedModel, corpus: Path | None = None, max_tokens: int = 4096, chunk: int = 1024
) -> QueryStats:
    name, text = corpus_text(corpus)
    ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
    tokens = torch.tensor([ids], device=loaded.device)
    cache = make_cache(
        loaded,
        make_policy("full"),
        Schedule(budget=2, buffer=1),
        prompt_len=0,
        row_seeds=[0],
        total_tokens=len(ids),
    )
    cache.query_window = len(ids)  # keep every query
    for start in range(0, len(ids), chunk):
        piece = tokens[:, start : start + chunk]
        positions = torch.arange(start, start + piece.shape[1], device=loaded.device)[None]
        loaded.model(
            input_ids=piece,
            position_ids=positions,
            **cache_argument(loaded.model, cache),
            use_cache=True,
            logits_to_keep=1,
        )
    positions = torch.arange(len(ids), device=loaded.device)
    recorded = [q for q in cache.queries if q is not None]
    if len(recorded) != len(cache.queries):
        raise RuntimeError(f"calibration recorded queries on {len(recorded)} of {len(cache.queries)} layers")
    pre_rope = [unrotate(q[0], positions, loaded.facts.rope_inv_freq) for q in recorded]
    return QueryStats.from_queries(loaded.spec.name, name, pre_rope)
