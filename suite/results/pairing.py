"""Which runs a run is compared with: its null and its full cache. One rule, used by `kvbench compare`,
`kvbench run`'s table, the leaderboard, `kvbench check` and submissions (export, accept, verify).

A run's null differs from it only in the policy and the problem limit: same model, task, protocol (seed
included), budget and the N_avg it came from, samples per problem, runtime, data and runner. Its full
cache shares the same, less the budget: unless the full cache's scores depend on K (the fidelity probe
scores what follows the first eviction event), then its resolved spec carries K and K must match.
Among several candidates (runs at other problem limits), the one at the same limit wins, else the one
over the most problems: the paired statistics then use the problems both ran.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol, TypeVar

from kvbench.specs.resolved import ResolvedSpec, Role, digest


class Paired(Protocol):
    """What the rule reads of a candidate (a planned cell, a stored run, a bundle's run): its spec."""

    @property
    def spec(self) -> ResolvedSpec: ...


T = TypeVar("T", bound=Paired)

_NOT_SHARED_WITH_NULL = ("policy", "limit")
_NOT_SHARED_WITH_REFERENCE = (*_NOT_SHARED_WITH_NULL, "budget", "ratio", "n_avg", "n_avg_measurement")


def pairs(run: ResolvedSpec, partner: ResolvedSpec, role: Role) -> bool:
    """Whether ``partner`` can stand as ``run``'s partner in ``role`` (null, or the full cache)."""
    if role == Role.REFERENCE:
        if partner.budget is not None and partner.budget != run.budget:
            return False
        left = run.without(*_NOT_SHARED_WITH_REFERENCE)
        right = partner.without(*_NOT_SHARED_WITH_REFERENCE)
    else:
        left, right = run.without(*_NOT_SHARED_WITH_NULL), partner.without(*_NOT_SHARED_WITH_NULL)
    return digest(left) == digest(right)  # as text: NaN (an undeclared N_avg) equals itself there


def cell_family(spec: ResolvedSpec) -> str:
    """What a policy run, its null and its full cache share, limit included: `kvbench verify` draws one
    set of problems per family, so that the runs it pairs are re-run on the same problems."""
    return digest(spec.without(*_NOT_SHARED_WITH_REFERENCE, "lm_eval") | {"limit": spec.limit})


def partner(run: ResolvedSpec, candidates: Iterable[T], role: Role) -> T | None:
    """The candidate that pairs with ``run`` in ``role``: at the same problem limit, else the one with the
    most problems (None, no limit, counts as the most)."""
    found = [c for c in candidates if pairs(run, c.spec, role)]

    def preference(candidate: T) -> tuple[bool, float]:
        limit = candidate.spec.limit
        return limit == run.limit, math.inf if limit is None else limit

    return max(found, key=preference, default=None)


def partners(run: ResolvedSpec, candidates: Iterable[T]) -> dict[str, T | None]:
    """A policy run's null and full cache among ``candidates``, named as messages name them: its protocol's
    baseline policy stored in the null's role, and its reference policy stored in the reference's."""
    candidates = list(candidates)
    wanted = {
        "null": (Role.NULL, run.protocol.baseline),
        "full cache": (Role.REFERENCE, run.protocol.reference),
    }
    return {
        name: partner(
            run, (c for c in candidates if (c.spec.role, c.spec.policy.name) == (role, policy)), role
        )
        for name, (role, policy) in wanted.items()
    }
