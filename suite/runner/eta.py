"""The time a run has left, weighted by what each kind of unit costs.

Units differ by far more than chance: on the embedded model an evicting arm's passkey unit took 60-230 s
where a fidelity unit took 6, so one pace for every unit misjudges a run whose remaining units are not
the mix it has done. A unit's kind is its task and whether its arm evicts (the full cache never does);
each remaining unit is estimated at the mean time of its kind's finished units, and a kind that has not
run yet at its tokens (Unit.cost: samples × expected length) times the seconds per token of the finished
units of its arm kind (of every finished unit while none of its arm kind has finished). Before a kind
has finished in this run, its pace on this machine in earlier runs (kvbench.runner.paces), where one is
stored, comes first: so the plan can say before the first token how long the run will take.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import NamedTuple


class UnitKind(NamedTuple):
    task: str
    evicts: bool
    """False for the full cache."""
    tokens: float
    """The unit's prior cost (kvbench.runner.executor.Unit.cost)."""


class Eta:
    """Fed the units a run will compute, then each as it finishes or turns out to be stored already."""

    def __init__(
        self, planned: list[UnitKind], prior: Mapping[tuple[str, bool], tuple[float, float]] | None = None
    ) -> None:
        self.pending: Counter[UnitKind] = Counter(planned)
        self.prior = dict(prior or {})
        """(task, evicts) → (seconds, tokens) of one unit in earlier runs on this machine."""
        self.seconds: defaultdict[tuple[str, bool], list[float]] = defaultdict(list)
        self.tokens: defaultdict[bool, float] = defaultdict(float)
        """Tokens of the finished units, by arm kind (evicts)."""
        self.spent: defaultdict[bool, float] = defaultdict(float)
        """Seconds of the finished units, by arm kind."""

    def skipped(self, unit: UnitKind) -> None:
        """A planned unit that needs no computing (its samples are stored)."""
        self._take(unit)

    def finished(self, unit: UnitKind, seconds: float) -> None:
        self._take(unit)
        self.seconds[unit.task, unit.evicts].append(seconds)
        self.tokens[unit.evicts] += unit.tokens
        self.spent[unit.evicts] += seconds

    def left(self, wall: float | None = None) -> float | None:
        """Seconds the pending units will take; None while some pending kind has no pace to go by (no
        unit finished here, none stored). ``wall``: the wall time the finished units took, when it
        differs from the sum of their own times (several at once, overheads): the estimate is scaled by
        that ratio."""
        spent = sum(self.spent.values())
        paces = [self._one(unit) for unit, count in self.pending.items() if count > 0]
        if (spent <= 0 and not self.prior) or any(pace is None for pace in paces):
            return None
        counts = [count for count in self.pending.values() if count > 0]
        estimate = sum(count * pace for count, pace in zip(counts, paces, strict=True) if pace is not None)
        return estimate if wall is None or spent <= 0 else estimate * wall / spent

    def from_prior(self) -> bool:
        """Whether the estimate rests on earlier runs' paces only (no unit of this run has finished)."""
        return not self.seconds and bool(self.prior)

    def _one(self, unit: UnitKind) -> float | None:
        seen = self.seconds.get((unit.task, unit.evicts))
        if seen:
            return sum(seen) / len(seen)
        before = self.prior.get((unit.task, unit.evicts))
        if before is not None:
            seconds, tokens = before
            return seconds * unit.tokens / tokens if tokens > 0 else seconds
        tokens, spent = self.tokens[unit.evicts], self.spent[unit.evicts]
        if tokens <= 0:
            tokens, spent = sum(self.tokens.values()), sum(self.spent.values())
        if tokens <= 0 and self.seconds:  # no cost known: the mean finished unit
            return spent / sum(map(len, self.seconds.values()))
        if tokens <= 0:  # nothing finished here: the stored seconds per token of the same arm kind
            same = [pace for (_, evicts), pace in self.prior.items() if evicts == unit.evicts] or list(
                self.prior.values()
            )
            seconds, tokens = sum(p[0] for p in same), sum(p[1] for p in same)
            return unit.tokens * seconds / tokens if same and tokens > 0 else None
        return unit.tokens * spent / tokens

    def _take(self, unit: UnitKind) -> None:
        if self.pending[unit] > 0:
            self.pending[unit] -= 1
