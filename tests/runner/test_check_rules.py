"""kvbench check's rules on hand-made results: the tolerance at ± ε around its bound, and every status."""

from __future__ import annotations

import math

import pytest

from kvbench.runner.check import CellResult, compare_with_reference, environment_changes

EPSILON = 1e-9


def cell(
    key: str = "m/t/p/snapkv{}/policy@256", *, score: float = 0.8, half: float = 0.05, **changes
) -> CellResult:
    fields = {
        "key": key,
        "identity": "id-1",
        "score": score,
        "low": score - half,
        "high": score + half,
        "problems": {"p0": score},
        "outputs": "digest-1",
        "code": "code-1",
    } | changes
    return CellResult(**fields)


def status(now: CellResult, reference: CellResult, environment: list[str] | None = None) -> tuple:
    (finding,) = compare_with_reference([now], [reference], environment or [])
    return finding.status, finding.fails, finding.tolerance


@pytest.mark.parametrize(("h_ref", "h_now"), [(0.05, 0.05), (0.03, 0.04), (0.1, 0.0)])
def test_the_tolerance_is_the_root_sum_of_squares_of_the_half_widths(h_ref: float, h_now: float) -> None:
    reference = cell(half=h_ref, score=0.8)
    bound = math.sqrt(h_ref**2 + h_now**2)
    within = cell(half=h_now, score=0.8 - bound + EPSILON, outputs="digest-2", code="code-2")
    beyond = cell(half=h_now, score=0.8 - bound - EPSILON, outputs="digest-2", code="code-2")
    assert status(within, reference) == ("changed with its code", False, pytest.approx(bound))
    assert status(beyond, reference)[:2] == ("regressed", True)
    better = cell(half=h_now, score=0.8 + 10 * bound, outputs="digest-2", code="code-2")
    assert status(better, reference)[:2] == ("changed with its code", False)  # only a drop fails


def test_every_status() -> None:
    reference = cell()
    assert status(cell(), reference)[:2] == ("same", False)
    assert status(cell(identity="id-2"), reference)[:2] == ("spec changed", True)
    assert status(cell(outputs="digest-2"), reference)[:2] == ("changed, code unchanged", True)
    assert status(cell(outputs="digest-2"), reference, ["transformers 5.24.0 -> 5.25.0"])[:2] == (
        "changed with the environment",
        False,
    )
    assert status(cell(outputs="digest-2", code="code-2"), reference)[:2] == ("changed with its code", False)
    findings = compare_with_reference([cell(key="new")], [cell(key="old")], [])
    assert {(f.key, f.status, f.fails) for f in findings} == {
        ("new", "no reference", True),
        ("old", "dropped", True),
    }


def test_environment_changes_name_what_moved() -> None:
    before = {
        "packages": {"torch": "2.13.0"},
        "python": "3.11.7",
        "hardware": {"cpu": "A", "torch_threads": 2},
    }
    after = {
        "packages": {"torch": "2.14.0"},
        "python": "3.11.7",
        "hardware": {"cpu": "B", "torch_threads": 2},
    }
    assert environment_changes(before, after) == ["cpu A -> B", "torch 2.13.0 -> 2.14.0"]
    assert environment_changes(before, before) == []
