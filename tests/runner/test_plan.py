"""Planning: suites expand into cells with the null and the full cache; identities are stable and honest."""

from __future__ import annotations

import pytest

from kvbench.errors import SpecError, UnknownNameError
from kvbench.runner.plan import RunRequest, plan


def test_default_request_adds_null_and_full_to_every_model_task_budget() -> None:
    cells = plan(RunRequest(policies=("snapkv",)))
    roles = {(c.task.name, c.policy.name, c.role) for c in cells}
    assert roles == {
        (t, p, r)
        for t in ("fidelity",)
        for p, r in (("snapkv", "policy"), ("random", "null"), ("full", "reference"))
    }
    assert {c.budget for c in cells} == {256}  # K = 1024 / 4, a multiple of the 64-token buffer
    assert all(c.model.name == "smollm2-135m" and c.limit == 12 for c in cells)


def test_identities_are_stable_and_follow_every_choice() -> None:
    first = {c.label: c.run_id for c in plan(RunRequest(policies=("snapkv",)))}
    assert first == {c.label: c.run_id for c in plan(RunRequest(policies=("snapkv",)))}
    changed = {c.label: c.run_id for c in plan(RunRequest(policies=("snapkv:window=32",)))}
    assert changed["smollm2-135m/fidelity/snapkv@K=256"] != first["smollm2-135m/fidelity/snapkv@K=256"]
    assert changed["smollm2-135m/fidelity/random@K=256"] == first["smollm2-135m/fidelity/random@K=256"]
    seeded = {c.label: c.run_id for c in plan(RunRequest(policies=("snapkv",), seed=7))}
    assert seeded["smollm2-135m/fidelity/random@K=256"] != first["smollm2-135m/fidelity/random@K=256"]


def test_one_full_cache_reference_serves_every_budget() -> None:
    cells = plan(RunRequest(suite="probes", tasks=("passkey",), policies=("snapkv",)))
    assert sorted({c.budget for c in cells if c.role == "policy"}) == [128, 256, 512]
    assert len([c for c in cells if c.role == "reference"]) == 1
    assert len([c for c in cells if c.role == "null"]) == 3


def test_fixed_budget_and_ratio_overrides() -> None:
    assert {c.budget for c in plan(RunRequest(policies=("snapkv",), budget=300))} == {300}
    assert {c.budget for c in plan(RunRequest(policies=("snapkv",), ratio=2))} == {512}
    with pytest.raises(SpecError, match="not both"):
        plan(RunRequest(policies=("snapkv",), budget=300, ratio=2))


@pytest.mark.parametrize(
    ("request_", "error", "message"),
    [
        (RunRequest(policies=("snapkvv",)), UnknownNameError, "policy 'snapkvv'. Did you mean 'snapkv'"),
        (RunRequest(tasks=("paskey",)), UnknownNameError, "unknown task 'paskey'. Did you mean 'passkey'"),
        (RunRequest(protocol="protect"), UnknownNameError, "unknown protocol 'protect'.*protect-prompt"),
        (RunRequest(models=("smol",)), UnknownNameError, "unknown model 'smol'"),
        (RunRequest(suite="fast"), UnknownNameError, "Known suites: ci, mixed-precision, probes, quick"),
    ],
)
def test_unknown_names_list_the_known_ones(request_: RunRequest, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        plan(request_)
