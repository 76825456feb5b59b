"""Teacher forcing through the eviction path: score a given continuation under a policy.

The prompt is prefilled, then the continuation is fed in chunks of at most B tokens per forward, each
chunk cut where token-by-token decoding would evict or, in a mixed-precision cache, demote
(``EvictingCache.tokens_until_due``), so that the cache every token attends to is exactly the one decoding
would have built — about B times fewer forwards. Optionally a full-cache stream (always in the model's
precision) runs in lockstep, for KL(full ‖ policy) and top-1 agreement per token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from kvbench.adapters.base import TeacherForced, Watch
from kvbench.adapters.hf.cache import EvictingCache, cache_argument, make_cache
from kvbench.adapters.hf.models import LoadedModel
from kvbench.core.contract import Policy
from kvbench.core.engine import PinnedSlots
from kvbench.core.mixed_kv import MixedLayerKV
from kvbench.core.schedule import Schedule
from kvbench.registry import make_policy


class _Stream:
    """One model state fed token chunks through one cache."""

    def __init__(self, loaded: LoadedModel, cache: EvictingCache) -> None:
        self.loaded, self.cache = loaded, cache

    def feed(self, tokens: Tensor, *, last_only: bool = False) -> Tensor:
        """Forward ``tokens`` [k, c]; return log-probabilities [k, c, V] (or [k, 1, V]) in fp32."""
        start = self.cache.seen
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device).expand_as(tokens)
        logits = self.loaded.model(
            input_ids=tokens,
            position_ids=positions,
            **cache_argument(self.loaded.model, self.cache),
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        ).logits
        return logits.float().log_softmax(dim=-1)


@torch.inference_mode()
def teacher_force(
    loaded: LoadedModel,
    prompt_ids: Sequence[int],
    continuation_ids: Sequence[int],
    policy: Policy,
    schedule: Schedule,
    *,
    row_seeds: Sequence[int] = (0,),
    calibration: Any = None,
    chunk: int | None = None,
    reference: bool = False,
    refuse_capped_prompt: bool = False,
    pinned: PinnedSlots | None = None,
    watch: Watch | None = None,
    on_step: Callable[[EvictingCache], None] | None = None,
) -> TeacherForced:
    """Score ``continuation_ids`` after ``prompt_ids`` for each row seed (rows differ in eviction draws).

    ``chunk`` caps the tokens per forward (default B; 1 is token-by-token decoding). With ``watch``, a
    chunk also ends where the watched moment begins, and the survival of its positions is read there.
    ``on_step`` sees the policy's cache after every forward's eviction check (as decoding's ``on_step``).
    """
    device = loaded.device
    k, total = len(row_seeds), len(prompt_ids) + len(continuation_ids)
    cont = torch.tensor(list(continuation_ids), dtype=torch.long, device=device)
    cache = make_cache(
        loaded,
        policy,
        schedule,
        prompt_len=len(prompt_ids),
        row_seeds=row_seeds,
        total_tokens=total,
        calibration=calibration,
        refuse_capped_prompt=refuse_capped_prompt,
        pinned=pinned,
    )
    streams = [_Stream(loaded, cache)]
    if reference:
        full = make_cache(
            loaded,
            make_policy("full"),
            schedule.without_precision(),
            prompt_len=len(prompt_ids),
            row_seeds=row_seeds,
            total_tokens=total,
        )
        streams.append(_Stream(loaded, full))

    prompt = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    predictions = []
    for stream in streams:
        last = stream.feed(prompt, last_only=True).expand(k, -1, -1)
        stream.cache.repeat_prompt_row(k)
        stream.cache.evict_if_due()
        predictions.append([last])

    policy_cache = streams[0].cache
    if on_step is not None:
        on_step(policy_cache)
    survival: tuple[Tensor | None, Tensor | None] = (None, None)
    survival = survival_of(policy_cache, watch) if watch is not None and watch.at == 0 else survival
    fed, limit = 0, chunk or schedule.buffer
    while fed < len(cont) - 1:  # the last token is predicted, never fed
        size = min(limit, len(cont) - 1 - fed)
        size = min(size, policy_cache.tokens_until_due())
        if watch is not None and fed < watch.at:
            size = min(size, watch.at - fed)
        tokens = cont[fed : fed + size].expand(k, -1)
        for stream, outputs in zip(streams, predictions, strict=True):
            outputs.append(stream.feed(tokens))
            stream.cache.evict_if_due()
        if on_step is not None:
            on_step(policy_cache)
        fed += size
        if watch is not None and fed == watch.at:
            survival = survival_of(policy_cache, watch)

    policy_logprobs = torch.cat(predictions[0], dim=1)  # [k, T, V]
    targets = cont.expand(k, -1).unsqueeze(-1)
    kl = agree = None
    if reference:
        full_logprobs = torch.cat(predictions[1], dim=1)
        kl = (full_logprobs.exp() * (full_logprobs - policy_logprobs)).sum(dim=-1)
        agree = full_logprobs.argmax(dim=-1) == policy_logprobs.argmax(dim=-1)
    log = policy_cache.evictor.retention
    watched = None
    if log is not None and watch is not None and watch.positions:
        watched = log.events_between(max(watch.positions), len(prompt_ids) + watch.at)
    return TeacherForced(
        logprobs=policy_logprobs.gather(-1, targets).squeeze(-1),
        greedy_match=policy_logprobs.argmax(dim=-1) == cont,
        kl_to_full=kl,
        top1_agrees_with_full=agree,
        eviction_events=policy_cache.evictor.stats.events,
        eviction_seconds=policy_cache.evictor.stats.seconds,
        peak_kv_bytes=policy_cache.peak_bytes,
        survival=survival[0],
        high_precision_survival=survival[1],
        kv_budget=policy_cache.budget,
        retention=[log.row(i) for i in range(k)] if log is not None else None,
        watched_events=watched,
    )


def survival_of(cache: EvictingCache, watch: Watch) -> tuple[Tensor, Tensor | None]:
    """[k, L, Hkv] each: the share of the watched positions each layer's KV heads hold now, and (for a
    mixed-precision cache) the share they hold in the model's precision."""
    watched = torch.tensor(watch.positions, dtype=torch.long)
    held, high = [], []
    for layer in cache.evicting_layers:
        slots = layer.slots
        present = torch.isin(slots.positions, watched.to(slots.positions.device))  # [k, Hkv, S]
        held.append(present.sum(dim=-1).float() / len(watch.positions))
        if isinstance(slots, MixedLayerKV):
            high.append((present & slots.high_precision).sum(dim=-1).float() / len(watch.positions))
    return torch.stack(held, dim=1).cpu(), torch.stack(high, dim=1).cpu() if high else None
