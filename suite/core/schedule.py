"""The eviction schedule: identical for every policy, owned by the engine (protocol.md, section 2).

- budget K: cache length right after an eviction, the buffer included;
- buffer B: the most recent B tokens are never candidates;
- trigger: after a step, when length > K and (length − K) is a multiple of B, so the cache oscillates
  between K and K + B;
- protection: the whole prompt, the first n sink tokens, or nothing; capped at K − B − 1 slots so that
  at least one candidate is always chosen by the policy (the cap is reported, never silent);
- compaction order: chronological (default) or score order;
- precision (optional, kvbench.core.precision): a mixed-precision cache demotes tokens to a few bits at
  the same moments, (length − K) a multiple of B, evicting or not; with ``budget_unit: bytes`` the budget
  K is the bytes of K tokens in the model's precision, and the cache holds as many tokens as fit them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from kvbench.core.precision import MixedPrecision, TokenCost, refuse_unknown, tokens_for_bytes
from kvbench.errors import BudgetError

Protection = Literal["prompt", "sinks", "none"]
Order = Literal["chronological", "score"]
BudgetUnit = Literal["tokens", "bytes"]


@dataclass(frozen=True)
class ProtectedPrefix:
    """How many leading positions are protected for one prompt, and whether the cap cut that short."""

    requested: int
    count: int

    @property
    def capped(self) -> bool:
        return self.count < self.requested


@dataclass(frozen=True)
class Schedule:
    budget: int
    buffer: int = 64
    protection: Protection = "prompt"
    sinks: int = 4
    """Protected leading tokens when ``protection == "sinks"``."""
    order: Order = "chronological"
    budget_multiple_of_buffer: bool = False
    """Refuse a budget that is not a multiple of the buffer (protocols with a ratio rule ask this)."""
    precision: MixedPrecision | None = None
    budget_unit: BudgetUnit = "tokens"

    def __post_init__(self) -> None:
        if self.buffer < 1:
            raise BudgetError(f"buffer must be at least 1 token, got {self.buffer}")
        if self.budget <= self.buffer:
            raise BudgetError(
                f"budget K={self.budget} must be larger than the buffer B={self.buffer}: the budget includes "
                f"the buffer, so K − B = {self.budget - self.buffer} slots would be left for the policy"
            )
        if self.budget_multiple_of_buffer and self.budget % self.buffer:
            lower = self.budget // self.buffer * self.buffer
            valid = " or ".join(str(k) for k in (lower, lower + self.buffer) if k > self.buffer)
            raise BudgetError(
                f"budget K={self.budget} is not a multiple of the buffer B={self.buffer}, "
                f"which this protocol requires; use {valid}"
            )
        refuse_unknown("protection", self.protection, Protection)
        refuse_unknown("order", self.order, Order)
        if self.protection == "sinks" and self.sinks < 0:
            raise BudgetError(f"sinks must be >= 0, got {self.sinks}")
        refuse_unknown("budget_unit", self.budget_unit, BudgetUnit)

    @property
    def keep(self) -> int:
        """Candidates kept per KV head at each event: K − B."""
        return self.budget - self.buffer

    def due(self, length: int) -> bool:
        """Whether a cache of ``length`` slots evicts now (checked after every step)."""
        return length > self.budget and self.on_phase(length)

    def most_slots(self, prompt_len: int) -> int:
        """The most slots an evicting cache holds: K + B, or the prompt and B more where a prompt longer
        than K waits for its first event."""
        return max(self.budget, prompt_len) + self.buffer

    def protected_prefix(self, prompt_len: int) -> ProtectedPrefix:
        """The protected leading positions for a prompt of ``prompt_len`` tokens."""
        requested = {"prompt": prompt_len, "sinks": self.sinks, "none": 0}[self.protection]
        # capped at K − B − 1, so that the policy always chooses at least one slot
        return ProtectedPrefix(requested=requested, count=min(requested, self.keep - 1))

    def capped_prompt(self, prompt_len: int) -> ProtectedPrefix | None:
        """The protected prefix when the protocol protects the whole prompt and K − B − 1 cuts it short;
        None otherwise (capped sinks are reported, never refused)."""
        protected = self.protected_prefix(prompt_len)
        return protected if self.protection == "prompt" and protected.capped else None

    def refuse_capped(self, prompt_len: int) -> None:
        """Raise when protecting the whole prompt does not fit K − B − 1 slots (runs that protect it)."""
        protected = self.capped_prompt(prompt_len)
        if protected is not None:
            raise BudgetError(
                f"the budget K={self.budget} with buffer B={self.buffer} leaves room to protect "
                f"{protected.count} prompt tokens, but the prompt has {protected.requested}: "
                f"use a budget of at least {protected.requested + self.buffer + 1}"
            )

    def tokens_until_due(self, length: int) -> int:
        """The smallest t >= 1 such that the cache evicts once it holds ``length + t`` slots.

        A backend that feeds several tokens per forward (teacher forcing) cuts its chunks here, so that
        every event fires at exactly the length token-by-token decoding would fire it.
        """
        if length < self.budget:
            return self.budget + self.buffer - length
        return self.tokens_until_phase(length)

    def on_phase(self, length: int) -> bool:
        """Whether ``length`` is an event moment, (length − K) a multiple of B: where a mixed-precision
        cache demotes, evicting or not."""
        return (length - self.budget) % self.buffer == 0

    def tokens_until_phase(self, length: int) -> int:
        """The smallest t >= 1 such that ``length + t`` is an event moment."""
        return self.buffer - (length - self.budget) % self.buffer

    def in_tokens(self, cost: TokenCost) -> Schedule:
        """This schedule with its budget in tokens: a byte budget becomes the most tokens whose footprint
        fits it (the same schedule when the budget is already in tokens)."""
        if self.budget_unit == "tokens":
            return self
        multiple = self.buffer if self.budget_multiple_of_buffer else 1
        tokens = tokens_for_bytes(self.budget, self.buffer, cost, self.precision, multiple=multiple)
        return replace(self, budget=tokens, budget_unit="tokens")

    def without_precision(self) -> Schedule:
        """The same eviction schedule over a cache kept wholly in the model's precision."""
        return replace(self, precision=None)
