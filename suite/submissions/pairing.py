"""Which runs a policy's run is compared with: the null and the full cache of the same cell.

The null differs from the policy's run only in its policy (same model, task, protocol, budget, samples,
problem limit, runtime, data, runner); the full cache does not depend on the budget, so it shares all of
those but the budget and the N_avg the budget came from.
"""

from __future__ import annotations

from typing import Any

from kvbench.submissions.contents import StoredRun

REFERENCE_SHARED = ("runner_version", "runtime", "model", "task", "protocol", "samples", "limit", "data")


def _without_policy(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != "policy"}


def shared(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: spec.get(k) for k in REFERENCE_SHARED}


def null_of(run: StoredRun, runs: list[StoredRun]) -> StoredRun | None:
    baseline = run.spec["protocol"]["baseline"]
    same = _without_policy(run.spec)
    found = (o for o in runs if o.role == "null" and o.spec["policy"]["name"] == baseline)
    return next((o for o in found if _without_policy(o.spec) == same), None)


def reference_of(run: StoredRun, runs: list[StoredRun]) -> StoredRun | None:
    reference = run.spec["protocol"]["reference"]
    same = shared(run.spec)
    found = (o for o in runs if o.role == "reference" and o.spec["policy"]["name"] == reference)
    return next((o for o in found if shared(o.spec) == same), None)
