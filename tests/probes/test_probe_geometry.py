"""A probe's geometry (its trace's `length`, the needle's `depth`) that cannot be laid out is an error
naming the task file, the field, the value and the fix, before anything runs (issue 32, part 4: a passkey
spec with `depth: 5000` and `length: 320` ran a 5,169-token trace without a word)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.cli import main
from kvbench.errors import SpecError
from kvbench.probes.problems import needle_problem


def _task(tmp_path: Path, source: str) -> Path:
    """A task file in a ``tasks`` folder (where `kvbench validate` knows its kind)."""
    path = tmp_path / "tasks" / "mine.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"spec_version: 1\nname: mine\ndescription: d\nmetric: exact\nsource: {source}\n")
    return path


def _errors(capsys: pytest.CaptureFixture) -> str:
    return " ".join(capsys.readouterr().err.split())  # the console wraps long lines


def _run(path: Path, out: Path) -> int:
    run = ["run", "--model", "tiny-qwen3", "--quiet", "--task", str(path), "--policy", "streaming"]
    return main([*run, "--limit", "1", "--out", str(out)])


def test_a_depth_beyond_the_length_is_refused_by_validate_and_run(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = _task(tmp_path, "{kind: probe, probe: passkey, problems: 1, length: 320, depth: 5000}")
    message = (
        f"{path}: 1 problem(s) in this TaskSpec: field `source.probe.depth`: Value error, `depth` 5000 does "
        "not fit in `length` 320: depth counts the filler tokens between the needle and its query inside "
        "the trace of `length` tokens, which also holds the needle, the query, the answer and filler before "
        "the needle; lower `depth` (the built-in probes put it at half of `length`: 160) or raise `length` "
        "(to about 10000 for the same proportions)"
    )
    assert main(["validate", str(path)]) == 2
    assert message in _errors(capsys)
    assert _run(path, tmp_path / "runs") == 2
    assert message in _errors(capsys)
    assert not (tmp_path / "runs").exists()  # refused before anything ran or was stored


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "{kind: probe, probe: planted-fact, problems: 1, length: 1024, depth: 1024}",
            "field `source.probe.depth`: Value error, `depth` 1024 does not fit in `length` 1024",
        ),
        (
            "{kind: probe, probe: fidelity, problems: 1, length: 1024, depth: 512}",
            "field `source.probe.depth`: Value error, a fidelity probe has no needle, so `depth` (512) is "
            "never read: remove it",
        ),
        (
            "{kind: probe, probe: fidelity, problems: 1, length: 1024, pin_heads: 1}",
            "field `source.probe.pin_heads`: Value error, a fidelity probe has no needle, so `pin_heads` (1) "
            "has nothing to pin: remove it",
        ),
        (  # held before; kept
            "{kind: probe, probe: passkey, problems: 1, length: 1024, depth: -1}",
            "field `source.probe.depth`: Input should be greater than or equal to 0 (correct its value)",
        ),
    ],
)
def test_other_impossible_geometry_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture, source: str, message: str
) -> None:
    path = _task(tmp_path, source)
    assert main(["validate", str(path)]) == 2
    errors = _errors(capsys)
    assert str(path) in errors and message in errors


@pytest.mark.parametrize(
    "source",
    [
        "{kind: probe, probe: passkey, problems: 1, length: 320, depth: 160}",
        "{kind: probe, probe: planted-fact, problems: 1, length: 1024, depth: 0, pin_heads: 1}",
        "{kind: probe, probe: fidelity, problems: 1, length: 320}",
    ],
)
def test_geometry_that_fits_still_validates(
    tmp_path: Path, capsys: pytest.CaptureFixture, source: str
) -> None:
    assert main(["validate", str(_task(tmp_path, source))]) == 0
    assert capsys.readouterr().out == "ok\ttask\tmine\n"


def test_a_depth_without_room_on_the_models_tokenizer_is_refused_before_any_unit(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Inside `length`, but tiny-qwen3's byte-level tokenizer spends 104 tokens on the rest of the trace."""
    path = _task(tmp_path, "{kind: probe, probe: passkey, problems: 1, length: 320, depth: 300}")
    assert main(["validate", str(path)]) == 0  # the room depends on the tokenizer: known when it loads
    capsys.readouterr()
    assert _run(path, tmp_path / "runs") == 2
    assert (
        "task 'mine': a passkey probe of `source.length` 320 has no room for `source.depth` 300 on this "
        "model's tokenizer: the needle (47 tokens), the query (45), the answer (4) and at least 8 filler "
        "tokens before the needle take 104 tokens besides the depth's filler; lower `source.depth` to at "
        "most 216 or raise `source.length` to at least 404"
    ) in _errors(capsys)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("kind", ["passkey", "planted-fact"])
def test_the_room_is_exact(kind: str) -> None:
    """The deepest needle that fits lays out a trace of about `length` tokens; one token deeper is refused."""

    def count(text: str) -> int:
        return len(text.encode())

    def layout(depth: int):
        return needle_problem(kind, 0, seed=0, length=400, depth=depth, count_tokens=count)

    with pytest.raises(
        SpecError, match=r"has no room for `source.depth` (\d+) .* to at most (\d+) "
    ) as caught:
        layout(400)
    deepest = int(caught.value.args[0].split("to at most ")[1].split(" ")[0])
    pieces = layout(deepest).pieces
    trace = sum(count(p.text) for p in pieces)
    # each of the two fillers ends on a whole sentence (under 100 bytes) past its count
    assert count(pieces[0].text) >= 8 and trace < 400 + 2 * 100
    with pytest.raises(SpecError, match=rf"`source.depth` {deepest + 1} .* at most {deepest} or"):
        layout(deepest + 1)
