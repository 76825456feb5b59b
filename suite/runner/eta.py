"""The time a run has left, weighted by what each kind of unit costs.

Units differ by far more than chance: on the embedded model an evicting arm's passkey unit took 60-230 s
where a fidelity unit took 6, so one pace for every unit misjudges a run whose remaining units are not
the mix it has done. A unit's kind is its task and whether its arm evicts (the full cache never does);
each remaining unit is estimated at the mean time of its kind's finished units, and a kind that has not
run yet at its tokens (Unit.cost: samples × expected length) times the seconds per token of the finished
units of its arm kind (of every finished unit while none of its arm kind has finished).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import NamedTuple


class UnitKind(NamedTuple):
    task: str
    evicts: bool
    """False for the full cache."""
    tokens: float
    """The unit's prior cost (kvbench.runner.executor.Unit.cost)."""


class Eta:
    """Fed the units a run will compute, then each as it finishes or turns out to be stored already."""

    def __init__(self, planned: list[UnitKind]) -> None:
        self.pending: Counter[UnitKind] = Counter(planned)
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
        """Seconds the pending units will take; None until a unit has finished. ``wall``: the wall time the
        finished units took, when it differs from the sum of their own times (several at once, overheads):
        the estimate is scaled by that ratio."""
        spent = sum(self.spent.values())
        if not self.seconds or spent <= 0:
            return None
        estimate = sum(count * self._one(unit) for unit, count in self.pending.items() if count > 0)
        return estimate if wall is None else estimate * wall / spent

    def _one(self, unit: UnitKind) -> float:
        seen = self.seconds.get((unit.task, unit.evicts))
        if seen:
            return sum(seen) / len(seen)
        tokens, spent = self.tokens[unit.evicts], self.spent[unit.evicts]
        if tokens <= 0:
            tokens, spent = sum(self.tokens.values()), sum(self.spent.values())
        if tokens <= 0:  # no cost known: the mean finished unit
            return spent / sum(map(len, self.seconds.values()))
        return unit.tokens * spent / tokens

    def _take(self, unit: UnitKind) -> None:
        if self.pending[unit] > 0:
            self.pending[unit] -= 1
