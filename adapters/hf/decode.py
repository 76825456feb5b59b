"""kvbench's decode loop: the k samples of one prompt decode as one batch under one eviction policy.

The prompt is prefilled once and its slots copied to the k rows. Every row samples with its own
torch.Generator (seeded from its sample seed), so a row's tokens do not depend on the other rows; a row
that emits a stop token or reaches ``max_new_tokens`` leaves the batch and the others go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from kvbench.adapters.base import GREEDY, Generation, Sample, Sampling, before_stop
from kvbench.adapters.hf.cache import EvictingCache, cache_argument, make_cache
from kvbench.adapters.hf.models import LoadedModel
from kvbench.core.contract import Policy
from kvbench.core.schedule import Schedule
from kvbench.core.seeding import generator


def processors(sampling: Sampling) -> LogitsProcessorList:
    """transformers' logits warpers for a protocol's sampling settings."""
    steps = LogitsProcessorList()
    if sampling.temperature > 0:
        steps.append(TemperatureLogitsWarper(sampling.temperature))
        if sampling.top_k > 0:
            steps.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1.0:
            steps.append(TopPLogitsWarper(sampling.top_p))
    return steps


def sample_next(logits: Tensor, sampling: Sampling, generators: Sequence[torch.Generator]) -> Tensor:
    """One next token per row: greedy, or sampled with each row's own generator."""
    if sampling.temperature <= 0:
        return logits.argmax(dim=-1)
    scores = processors(sampling)(None, logits.float())  # type: ignore[arg-type]  # warpers never read ids
    probs = scores.softmax(dim=-1)
    return torch.cat([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generators)])


@torch.inference_mode()
def generate(
    loaded: LoadedModel,
    prompt_ids: Sequence[int],
    policy: Policy,
    schedule: Schedule,
    *,
    sample_seeds: Sequence[int],
    sampling: Sampling = GREEDY,
    max_new_tokens: int = 256,
    ignore_stop: bool = False,
    stop_ids: Sequence[int] | None = None,
    stop_strings: Sequence[str] = (),
    calibration: Any = None,
    refuse_capped_prompt: bool = False,
    on_step: Callable[[EvictingCache], None] | None = None,
) -> Generation:
    """Decode len(sample_seeds) samples of one prompt under ``policy``.

    ``stop_ids`` overrides the model's stop tokens; ``ignore_stop`` decodes ``max_new_tokens`` regardless.
    ``stop_strings`` also end a row once its generated text contains one (lm-eval's ``until``); its text is
    then cut before the first of them.
    ``on_step`` sees the cache after every decode step's eviction check (for tests and benchmarks).
    """
    model, device = loaded.model, loaded.device
    k, prompt_len = len(sample_seeds), len(prompt_ids)
    cache = make_cache(
        loaded,
        policy,
        schedule,
        prompt_len=prompt_len,
        row_seeds=sample_seeds,
        total_tokens=prompt_len + max_new_tokens,
        calibration=calibration,
        refuse_capped_prompt=refuse_capped_prompt,
    )
    stop_ids = [] if ignore_stop else list(stop_ids) if stop_ids is not None else loaded.stop_ids()
    stop = torch.tensor(stop_ids, dtype=torch.long, device=device)
    generators = [generator(seed, device) for seed in sample_seeds]
    texts = StopStrings(loaded.tokenizer, [] if ignore_stop else stop_strings)

    logits = _prefill(model, cache, prompt_ids, k, device)

    rows = list(range(k))  # original sample index of each live batch row
    tokens: list[list[int]] = [[] for _ in range(k)]
    finished: dict[int, Sample] = {}
    started = time.perf_counter()
    for step in range(max_new_tokens):
        next_tokens = sample_next(logits, sampling, [generators[r] for r in rows])
        for row, token in zip(rows, next_tokens.tolist(), strict=True):
            tokens[row].append(token)
        stopped = [
            bool(hit) or texts.reached(tokens[row])
            for row, hit in zip(rows, torch.isin(next_tokens, stop).tolist(), strict=True)
        ]
        last = step == max_new_tokens - 1
        keep = [i for i, done in enumerate(stopped) if not (done or last)]
        for i, row in enumerate(rows):
            if i not in keep:
                reason: Literal["stop", "length"] = "stop" if stopped[i] else "length"
                retention = cache.evictor.retention.row(i) if cache.evictor.retention is not None else None
                finished[row] = Sample(tokens[row], "", reason, cache.evictor.stats.events, retention)
        if not keep:
            break
        if len(keep) < len(rows):
            cache.select_rows(keep)
            rows = [rows[i] for i in keep]
            next_tokens = next_tokens[keep]
        logits = _decode_step(model, cache, next_tokens)
        if on_step is not None:
            on_step(cache)
    decode_seconds = time.perf_counter() - started
    samples = [finished[r] for r in range(k)]
    for sample in samples:
        sample.text = texts.cut(loaded.tokenizer.decode(sample.tokens, skip_special_tokens=True))
    return Generation(
        samples=samples,
        prompt_tokens=prompt_len,
        eviction_events=cache.evictor.stats.events,
        eviction_seconds=cache.evictor.stats.seconds,
        decode_seconds=decode_seconds,
        peak_kv_bytes=cache.peak_bytes,
        kv_budget=cache.budget,
        protected=cache.evictor.stats.protected,
        settings={
            "sampling": sampling,
            "max_new_tokens": max_new_tokens,
            "ignore_stop": ignore_stop,
            "stop_strings": list(texts.stops),
        },
    )


class StopStrings:
    """Whether a row's generated text contains a stop string, checked on its last few tokens after every
    step (a stop string can span tokens), and confirmed on the whole text before the row is ended."""

    def __init__(self, tokenizer: Any, stops: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        # however the model spells a stop string, each of its tokens writes at least one byte of it
        self.lookback = max((len(s.encode("utf-8")) for s in self.stops), default=0) + 2

    def reached(self, tokens: Sequence[int]) -> bool:
        if not self.stops:
            return False
        tail = self.tokenizer.decode(tokens[-self.lookback :], skip_special_tokens=False)
        if not any(s in tail for s in self.stops):
            return False
        whole = self.tokenizer.decode(tokens, skip_special_tokens=False)
        return any(s in whole for s in self.stops)

    def cut(self, text: str) -> str:
        return before_stop(text, self.stops)


def _prefill(
    model: Any, cache: EvictingCache, prompt_ids: Sequence[int], samples: int, device: torch.device
) -> Tensor:
    """One forward over the prompt, its slots then copied to each sample's row; the next-token logits."""
    prompt = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    logits = model(
        input_ids=prompt,
        position_ids=torch.arange(len(prompt_ids), device=device)[None],
        **cache_argument(model, cache),
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    cache.repeat_prompt_row(samples)
    cache.evict_if_due()
    return logits.expand(samples, -1)


def _decode_step(model: Any, cache: EvictingCache, tokens: Tensor) -> Tensor:
    """One forward of each live row's new token at the next position, then the eviction check."""
    position = torch.full((len(tokens), 1), cache.seen, device=tokens.device)
    logits = model(
        input_ids=tokens[:, None],
        position_ids=position,
        **cache_argument(model, cache),
        use_cache=True,
    ).logits[:, -1]
    cache.evict_if_due()
    return logits
