"""kvbench check's rules on hand-made results: the tolerance at ± ε around its bound, and every status."""

from __future__ import annotations

import math

import pytest

from kvbench.results.check import CellResult, compare_with_reference
from kvbench.store.manifest import Provenance

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


def environment_changes(before: dict, after: dict) -> list[str]:
    return Provenance.model_validate(before).environment_changes(Provenance.model_validate(after))


def test_a_drop_of_exactly_the_tolerance_passes() -> None:
    # binary fractions, so that the bound is exact: hypot(0.375, 0.5) = 0.625 = 0.75 − 0.125
    reference = cell(score=0.75, half=0.375)
    now = cell(score=0.125, half=0.5, outputs="digest-2", code="code-2")
    assert status(now, reference) == ("changed with its code", False, 0.625)


def test_each_finding_tells_the_reader_what_to_do() -> None:
    reference = cell()

    def detail(now: CellResult, environment: list[str] | None = None) -> str:
        (finding,) = compare_with_reference([now], [reference], environment or [])
        return finding.detail

    assert detail(cell(score=0.5)) == "score fell by 0.3000, more than the tolerance 0.0707"
    assert "then run --update-reference" in detail(cell(identity="id-2"))
    assert "engine, runner or model code did" in detail(cell(outputs="digest-2"))
    assert detail(cell(outputs="digest-2"), ["torch 1 -> 2", "cpu A -> B"]) == (
        "the environment differs: torch 1 -> 2, cpu A -> B"
    )
    assert "the policy's source changed" in detail(cell(outputs="digest-2", code="code-2"))
    assert detail(cell()) == ""
    (missing,) = compare_with_reference([cell(key="new")], [], [])
    assert missing.detail == "run --update-reference"
    (dropped,) = compare_with_reference([], [cell(key="old")], [])
    assert "in the reference, not in this run" in dropped.detail


def test_every_cell_is_judged_after_one_without_reference() -> None:
    findings = compare_with_reference([cell(key="new"), cell(key="a"), cell(key="b", identity="x")],
                                      [cell(key="a"), cell(key="b")], [])  # fmt: skip
    assert [(f.key, f.status) for f in findings] == [
        ("new", "no reference"),
        ("a", "same"),
        ("b", "spec changed"),
    ]


def test_python_cpu_and_threads_count_as_environment() -> None:
    base = {"packages": {}, "python": "3.11.7", "hardware": {"cpu": "A", "torch_threads": 2}}
    moved = {"packages": {}, "python": "3.12.1", "hardware": {"cpu": "A", "torch_threads": 4}}
    assert environment_changes(base, moved) == ["python 3.11.7 -> 3.12.1", "torch_threads 2 -> 4"]
