"""Where a request's tokens live in paged memory under kvbench's schedule: a pure function of its length.

The engine's schedule (protocol.md, section 2) fixes K, B and the trigger, and every KV head keeps the
same count.
So the number of slots a request occupies after ``L`` tokens have been written (and any event due at
``L`` has run) depends only on ``L``, its prompt length and the schedule:

    first event   E = the smallest L >= max(P, K + 1) with (L − K) a multiple of B
    stored(L)     = L                      while L < E
                  = K + (L − K) mod B      from E on

The scheduler (to size each request's blocks) and the worker (slot mapping, sequence lengths, when to
compact) both compute it from the logical length they already have; nothing travels between them, so
an event can never be seen by one side and not the other. The prompt bound on E mirrors the hf
backend, which checks the schedule after the whole prompt is in: a chunked prefill never evicts halfway.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.core.schedule import Schedule


@dataclass(frozen=True)
class PagedSchedule:
    """One request's schedule in paged memory; ``evicts`` is False for the full cache."""

    budget: int
    buffer: int
    prompt_len: int
    evicts: bool = True

    @classmethod
    def of(cls, schedule: Schedule, prompt_len: int, *, evicts: bool) -> PagedSchedule:
        return cls(schedule.budget, schedule.buffer, prompt_len, evicts)

    @property
    def first_event(self) -> int:
        """The logical length at which the first eviction event runs."""
        k, b = self.budget, self.buffer
        start = max(self.prompt_len, k + 1)
        return k + -(-(start - k) // b) * b

    def stored(self, length: int) -> int:
        """Slots occupied once ``length`` tokens are written and the event due at ``length`` (if any) ran."""
        if not self.evicts or length < self.first_event:
            return length
        return self.budget + (length - self.budget) % self.buffer

    def due(self, length: int) -> bool:
        """Whether the forward that brought the request to ``length`` tokens is followed by an event."""
        return self.evicts and length >= self.first_event and (length - self.budget) % self.buffer == 0

    def peak_slots(self, total_len: int) -> int:
        """The most slots the request ever holds on its way to ``total_len`` tokens (before compaction
        the event's last token is already written, so the peak is E, not K + B − 1)."""
        if not self.evicts or total_len < self.first_event:
            return total_len
        return self.first_event

    def blocks(self, total_len: int, block_size: int) -> int:
        """The request's block cap: its peak slots, rounded up to whole blocks."""
        return -(-self.peak_slots(total_len) // block_size)
