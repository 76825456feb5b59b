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
    memo: FullCacheMemo | None = None,
) -> TeacherForced:
    """Score ``continuation_ids`` after ``prompt_ids`` for each row seed (rows differ in eviction draws).

    ``chunk`` caps the tokens per forward (default B; 1 is token-by-token decoding). With ``watch``, a
    chunk also ends where the watched moment begins, and the survival of its positions is read there.
    ``on_step`` sees the policy's cache after every forward's eviction check (as decoding's ``on_step``).
    With ``reference``, the full cache's stream is fed the policy's chunks after it; ``memo`` keeps its
    predictions for the next policy on the same problem.
    """
    device = loaded.device
    k, total = len(row_seeds), len(prompt_ids) + len(continuation_ids)
    cont = torch.tensor(list(continuation_ids), dtype=torch.long, device=device)
    policy_cache = make_cache(
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
    stream = _Stream(loaded, policy_cache)
    prompt = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    predictions = [stream.feed(prompt, last_only=True).expand(k, -1, -1)]
    policy_cache.repeat_prompt_row(k)
    policy_cache.evict_if_due()
    if on_step is not None:
        on_step(policy_cache)
    survival: tuple[Tensor | None, Tensor | None] = (None, None)
    survival = survival_of(policy_cache, watch) if watch is not None and watch.at == 0 else survival
    fed, limit, plan = 0, chunk or schedule.buffer, []
    while fed < len(cont) - 1:  # the last token is predicted, never fed
        size = min(limit, len(cont) - 1 - fed)
        size = min(size, policy_cache.tokens_until_due())
        if watch is not None and fed < watch.at:
            size = min(size, watch.at - fed)
        predictions.append(stream.feed(cont[fed : fed + size].expand(k, -1)))
        policy_cache.evict_if_due()
        plan.append(size)
        if on_step is not None:
            on_step(policy_cache)
        fed += size
        if watch is not None and fed == watch.at:
            survival = survival_of(policy_cache, watch)

    policy_logprobs = torch.cat(predictions, dim=1)  # [k, T, V]
    targets = cont.expand(k, -1).unsqueeze(-1)
    kl = agree = None
    if reference:
        if not policy.evicts and schedule.precision is None:  # the policy's stream is the full cache's
            full_logprobs = policy_logprobs
        else:
            full_logprobs = full_cache_predictions(loaded, prompt_ids, cont, schedule, plan, k, memo)
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


class FullCacheMemo:
    """The full cache's predictions for the last problem teacher-forced with a reference.

    Every policy of a protocol shares K and B, so on one problem each one's stream is cut into the same
    chunks and the full cache's predictions are the same tensor, bit for bit: the policies after the
    first read them here instead of running the full model again. One problem is kept (the runner
    takes a problem's policies one after another).
    """

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.logprobs: Tensor | None = None


def full_cache_predictions(
    loaded: LoadedModel,
    prompt_ids: Sequence[int],
    continuation: Tensor,
    schedule: Schedule,
    plan: Sequence[int],
    rows: int,
    memo: FullCacheMemo | None,
) -> Tensor:
    """The full cache's log-probabilities [rows, T, V] after ``prompt_ids``, ``continuation`` fed in the
    chunks of ``plan`` (a batch's rows are identical: there is nothing to draw)."""
    schedule = schedule.without_precision()
    key = (tuple(prompt_ids), tuple(continuation.tolist()), schedule, tuple(plan), rows)
    if memo is not None and memo.key == key and memo.logprobs is not None:
        return memo.logprobs
    if memo is not None:
        memo.key = memo.logprobs = None  # the last problem's predictions go before this one's are made
    cache = make_cache(
        loaded,
        make_policy("full"),
        schedule,
        prompt_len=len(prompt_ids),
        row_seeds=range(rows),
        total_tokens=len(prompt_ids) + len(continuation),
    )
    stream = _Stream(loaded, cache)
    prompt = torch.tensor([list(prompt_ids)], dtype=torch.long, device=loaded.device)
    predictions = [stream.feed(prompt, last_only=True).expand(rows, -1, -1)]
    cache.repeat_prompt_row(rows)
    cache.evict_if_due()
    fed = 0
    for size in plan:
        predictions.append(stream.feed(continuation[fed : fed + size].expand(rows, -1)))
        cache.evict_if_due()
        fed += size
    logprobs = torch.cat(predictions, dim=1)
    if memo is not None:
        memo.key, memo.logprobs = key, logprobs
    return logprobs


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
