"""vLLM's scheduler with kvbench's block cap and footprint-aware admission (``scheduler_cls``).

- Blocks follow the stored length, not the logical one: a request asks for blocks as if it had
  ``stored(L)`` computed tokens (paged_schedule.py), so it never holds more than its cap,
  ``ceil(peak / block_size)`` blocks. Nothing has to be freed: the blocks past the cap are never taken.
- Admission counts every running request's remaining growth to its cap (an evicting request's cap is
  small and fixed; a full-cache one grows to prompt + max_tokens). A waiting request starts only if the
  free blocks cover that growth and its own cap, so a running request never finds the pool empty and
  is never preempted: preemption would recompute the whole logical sequence and bring evicted tokens
  back. Preemptions are counted all the same, and kvbench refuses results from a run that had one.

The private methods overridden are ``KVCacheManager.allocate_slots`` and ``free`` (their signatures are
checked in guard.py, and any drift stops the engine before it starts).
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.scheduler import Scheduler

from kvbench.adapters.vllm.guard import check_engine
from kvbench.adapters.vllm.paged_schedule import PagedSchedule
from kvbench.adapters.vllm.request_config import RequestConfig


def paged_schedule(request: Any) -> PagedSchedule:
    """The request's schedule in paged memory (a request kvbench did not send never evicts)."""
    config = RequestConfig.from_sampling(request.sampling_params)
    if config is None or not config.evicts:
        return PagedSchedule(budget=1, buffer=1, prompt_len=request.num_prompt_tokens, evicts=False)
    return PagedSchedule(config.budget, config.buffer, request.num_prompt_tokens, evicts=True)


class CappedKVCacheManager(KVCacheManager):
    """Allocates by stored length and admits by capped footprint."""

    block_size: int
    caps: dict[str, int]
    """Block cap of every request holding blocks."""

    def setup(self, block_size: int) -> None:
        self.block_size = block_size
        self.caps = {}

    def cap_blocks(self, request: Any) -> int:
        total = min(request.num_prompt_tokens + request.max_tokens, self.max_model_len)
        return paged_schedule(request).blocks(total, self.block_size)

    def held_blocks(self, request_id: str) -> int:
        manager = self.coordinator.single_type_managers[0]
        return len(manager.req_to_blocks.get(request_id, ()))

    def allocate_slots(self, request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        admitting = request.request_id not in self.caps
        if admitting:
            growth = sum(max(cap - self.held_blocks(rid), 0) for rid, cap in self.caps.items())
            cap = self.cap_blocks(request)
            if growth + cap > self.block_pool.get_num_free_blocks():
                return None  # it waits: admitting it could leave a running request without blocks
        logical = request.num_computed_tokens
        # vLLM sizes the allocation from num_computed_tokens: show it the stored length for this call.
        request.num_computed_tokens = paged_schedule(request).stored(logical)
        try:
            blocks = super().allocate_slots(request, num_new_tokens, *args, **kwargs)
        finally:
            request.num_computed_tokens = logical
        if admitting and blocks is not None:
            self.caps[request.request_id] = cap
        return blocks

    def free(self, request: Any) -> None:
        self.caps.pop(request.request_id, None)
        super().free(request)


class KVBenchScheduler(Scheduler):
    """vLLM's scheduler over a :class:`CappedKVCacheManager` (preemptions are counted by vLLM's own
    metrics, which the backend reads after every batch)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        check_engine(self.vllm_config)
        manager = self.kv_cache_manager
        if len(manager.coordinator.single_type_managers) != 1:
            raise RuntimeError("kvbench's vLLM scheduler needs one KV-cache group (full attention only)")
        manager.__class__ = CappedKVCacheManager  # the same object, with the two methods above
        manager.setup(self.cache_config.block_size)
