"""Every value a user can pass is validated before a model loads, with one message naming the flag or
field and the fix (issue: "validation of everything a user can pass"). Each case was a traceback or a
silent wrong value before."""

from __future__ import annotations

import json
import shutil
from importlib.resources import files
from pathlib import Path

import pytest

from kvbench.cli import main
from kvbench.errors import SpecError, UnknownNameError
from kvbench.registry import make_policy
from kvbench.runner.plan import RunRequest, plan
from kvbench.specs.loading import SPEC_ROOT
from kvbench.specs.model import load_model_spec
from kvbench.specs.protocol import load_protocol
from kvbench.specs.suite import load_suite
from kvbench.specs.task import load_task
from kvbench.specs.task_data import load_problems
from kvbench.specs.validate import validate_paths

HUB = Path(__file__).resolve().parent / "fixtures" / "hub"
TINY = ("tiny-qwen3",)


def _plan(**fields) -> None:
    plan(RunRequest(models=TINY, **fields))


def _copy_builtin(tmp_path: Path, folder: str, name: str) -> Path:
    target = tmp_path / folder
    target.mkdir(exist_ok=True)
    return Path(shutil.copy(SPEC_ROOT / folder / f"{name}.yaml", target / f"{name}.yaml"))


# -- these raised tracebacks --------------------------------------------------------------------------
def test_a_yaml_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "models" / "latin1.yaml"
    path.parent.mkdir()
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(
        SpecError, match=r"latin1.yaml: not UTF-8 text \(byte 0xe9 at offset 9\): save the file"
    ):
        load_model_spec(path)


def test_a_policy_file_that_raises_on_import_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken_scorer.py"
    path.write_text("import kvbench\nRATE = 1 / 0\n")
    with pytest.raises(
        SpecError, match=r"importing .*broken_scorer.py raised ZeroDivisionError: division by zero"
    ):
        make_policy(f"{path}:Broken")


@pytest.mark.parametrize("limit", [0, -1])
@pytest.mark.parametrize("task", ["passkey", "gsm8k"])  # a probe and a hub task (the latter ran 1 problem)
def test_limit_below_one(limit: int, task: str) -> None:
    with pytest.raises(SpecError, match=rf"--limit {limit}: Input should be greater than or equal to 1"):
        _plan(tasks=(task,), limit=limit, budget=512)


@pytest.mark.parametrize("samples", [-2, 0])  # 0 silently became the task's default
def test_samples_below_one(samples: int) -> None:
    with pytest.raises(SpecError, match=rf"--samples {samples}: Input should be greater than 0 .*`samples`"):
        _plan(samples=samples)


def test_max_new_tokens_zero_on_a_generation_task() -> None:
    with pytest.raises(SpecError, match=r"--max-new-tokens 0: Input should be greater than 0"):
        _plan(tasks=("gsm8k",), max_new_tokens=0, budget=512)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("ratios: [0]", r"field `ratios.0`: Input should be greater than 1"),
        ("ratios: [4, 4]", r"ratios \[4.0, 4.0\] repeat a value"),
        ("limit: -3", r"field `limit`: Input should be greater than or equal to 1"),
    ],
)
def test_suite_values(tmp_path: Path, line: str, message: str) -> None:
    path = _copy_builtin(tmp_path, "suites", "quick")
    path.write_text(
        path.read_text().replace("limit: 12", line) if "limit" in line else path.read_text() + line
    )
    with pytest.raises(SpecError, match=message):
        load_suite(path)


def test_a_malformed_data_csv_is_named(tmp_path: Path) -> None:
    data = shutil.copytree(HUB / "Idavidrein" / "gpqa", tmp_path / "gpqa")
    (data / "gpqa_diamond.csv").write_text('Question,Correct Answer\n"unclosed,quote\nx,y,z,w\n')
    with pytest.raises(SpecError, match=r"task 'gpqa-diamond': cannot load --data .*gpqa"):
        load_problems(load_task("gpqa-diamond"), data)


def test_data_without_the_task_columns_is_named(tmp_path: Path) -> None:
    data = shutil.copytree(HUB / "Idavidrein" / "gpqa", tmp_path / "gpqa")
    (data / "gpqa_diamond.csv").write_text("Question,Answer\nq,a\n")
    with pytest.raises(
        SpecError, match=r"has no column\(s\) Correct Answer, Incorrect Answer 1, .*Record ID"
    ):
        load_problems(load_task("gpqa-diamond"), data)


# -- these ran with a wrong value -----------------------------------------------------------------------
def _math500_copy(tmp_path: Path, rows: list[dict]) -> Path:
    """A local MATH-500 in the hub's layout (one JSON-lines file) holding ``rows``."""
    data = tmp_path / "MATH-500"
    data.mkdir()
    (data / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return data


GOOD = {"problem": "What is $1+1$?", "answer": "2", "unique_id": "test/fixture-0.json"}


def test_data_rows_without_a_question_or_answer_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Only the first row's keys were checked: these rows ran as the prompt or gold answer 'None'."""
    no_answer = {k: v for k, v in GOOD.items() if k != "answer"}
    rows = [GOOD, {**GOOD, "problem": "  \n"}, {**GOOD, "answer": None}, no_answer, {**GOOD, "problem": ""}]
    data = _math500_copy(tmp_path, rows)
    out = tmp_path / "runs"
    run = ["run", "--model", "tiny-qwen3", "--quiet", "--task", "math500", "--data", str(data)]
    assert main([*run, "--policy", "streaming", "--budget", "256", "--out", str(out)]) == 2
    assert (
        f"kvbench: task 'math500': --data {data} has rows without a value the task reads (missing, null, "
        "empty or only whitespace; rows counted from 0 in split 'test'): "
        "column 'problem' (`fields.question`): rows 1, 4 (2 in all) "
        "column 'answer' (`fields.answer`): rows 2, 3 (2 in all) "
        "Fill in those values or remove those rows: they would reach the prompts and gold answers as 'None' "
        "or empty text"
    ) in " ".join(capsys.readouterr().err.split())
    assert not out.exists()  # refused before a model loaded or anything was stored


def test_many_bad_rows_are_counted_and_a_csvs_empty_cells_named(tmp_path: Path) -> None:
    data = _math500_copy(tmp_path, [GOOD] + [{**GOOD, "answer": " "}] * 8)
    with pytest.raises(
        SpecError, match=r"column 'answer' \(`fields.answer`\): rows 1, 2, 3, 4, 5, \.\.\. \(8 in"
    ):
        _plan(tasks=("math500",), data=str(data), budget=256)
    gpqa = shutil.copytree(HUB / "Idavidrein" / "gpqa", tmp_path / "gpqa")
    csv = gpqa / "gpqa_diamond.csv"
    lines = csv.read_text().splitlines()
    lines[2] = ",".join(cell if i != 3 else "" for i, cell in enumerate(lines[2].split(",")))
    csv.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        SpecError,
        match=r"--data .*gpqa has rows without a value .*\n  column 'Incorrect Answer 2' "
        r"\(`fields.incorrect\[1\]`\): row 1\n",
    ):
        _plan(tasks=("gpqa-diamond",), data=str(gpqa), budget=256)


def test_data_without_rows_the_task_keeps_is_named(tmp_path: Path) -> None:
    task = tmp_path / "tasks" / "math500.yaml"
    task.parent.mkdir()
    builtin = Path(str(files("kvbench.tasks"))) / "math500.yaml"
    task.write_text(builtin.read_text().replace("  split: test\n", "  split: test\n  where: {level: '9'}\n"))
    data = HUB / "HuggingFaceH4" / "MATH-500"
    with pytest.raises(
        SpecError,
        match=r"task 'math500': --data .*MATH-500 has no rows that `where` keeps \(\{'level': '9'\}\) in "
        r"split 'test': give a copy with the task's problems, or fix the task's `split` or `where`",
    ):
        _plan(tasks=(str(task),), data=str(data), budget=256)


def test_data_whose_rows_all_hold_values_still_plans(tmp_path: Path) -> None:
    for data in (HUB / "HuggingFaceH4" / "MATH-500", _math500_copy(tmp_path, [{**GOOD, "answer": 0}])):
        cells = plan(RunRequest(models=TINY, tasks=("math500",), data=str(data), budget=256))
        assert {c.data for c in cells} == {str(data)}  # an answer 0 is a value


@pytest.mark.parametrize("ratio", [0, 1, 0.5])  # 0 became the protocol's 4; 1 and 0.5 gave K >= N_avg
def test_ratio_at_most_one(ratio: float) -> None:
    with pytest.raises(SpecError, match=rf"--ratio {ratio!r}: Input should be greater than 1"):
        _plan(ratio=ratio)


def test_budget_below_one() -> None:
    with pytest.raises(SpecError, match=r"--budget 0: Input should be greater than 0"):
        _plan(budget=0)


def test_a_policy_parameter_given_twice() -> None:
    with pytest.raises(SpecError, match=r"parameter 'lam' is given twice; give it once"):
        make_policy("rkv:lam=0.1,lam=0.9")


def test_a_duplicate_yaml_key(tmp_path: Path) -> None:
    path = _copy_builtin(tmp_path, "protocols", "protect-prompt")
    path.write_text(path.read_text() + "buffer: 32\n")
    with pytest.raises(
        SpecError, match=r"line 20, column 1: key .buffer. appears twice in one mapping \(first at line 10\)"
    ):
        load_protocol(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("heads: 4", r"field `source.random-qwen3.heads`: Input should be greater than or equal to 1"),
        ("layers: 2", r"field `source.random-qwen3.layers`: Input should be greater than or equal to 1"),
        ("kv_heads: 2", r"kv_heads \(3\) must divide heads \(4\)"),
    ],
)
def test_impossible_model_shapes(tmp_path: Path, change: str, message: str) -> None:
    path = _copy_builtin(tmp_path, "models", "tiny-qwen3")
    key = change.split(":")[0]
    bad = {"heads": "heads: 0", "layers": "layers: -1", "kv_heads": "kv_heads: 3"}[key]
    assert change in path.read_text()
    path.write_text(path.read_text().replace(change, bad))
    with pytest.raises(SpecError, match=message):
        validate_paths(path)


@pytest.mark.parametrize(
    ("field", "value", "fix"),
    [
        ("baseline", "randon", "write `baseline: random`"),
        ("baseline", "evict-range", "write `baseline: random`"),  # the board said "vs Random Attention"
        ("reference", "random", "write `reference: full`"),
    ],
)
def test_a_protocol_whose_null_or_reference_is_another_policy_is_refused(
    tmp_path: Path, field: str, value: str, fix: str
) -> None:
    path = _copy_builtin(tmp_path, "protocols", "protect-prompt")
    original = "baseline: random" if field == "baseline" else "reference: full"
    path.write_text(path.read_text().replace(original, f"{field}: {value}"))
    for load in (validate_paths, load_protocol):
        with pytest.raises(SpecError) as raised:
            load(path)
        message = str(raised.value)
        assert str(path) in message and f"field `{field}`" in message and f"'{value}' is not the" in message
        assert fix in message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1.0e+6", "Input should be less than or equal to 65536"),  # ran with no eviction, broke ingest
        ("1.0e+21", "Unable to parse input string as an integer, exceeded maximum size"),
        ("1e21", "Input should be a valid integer"),  # YAML 1.1 reads this one as a string
    ],
)
def test_an_absurd_buffer(tmp_path: Path, value: str, message: str) -> None:
    path = _copy_builtin(tmp_path, "protocols", "protect-prompt")
    path.write_text(path.read_text().replace("buffer: 64", f"buffer: {value}"))
    with pytest.raises(SpecError, match=f"field `buffer`: {message}"):
        load_protocol(path)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kvbench.bench.leaderboard import synthetic_store

    database = tmp_path_factory.mktemp("pool") / "store.duckdb"
    synthetic_store(database, policies=1, tasks=2, problems=5, samples=1)
    return database


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        ("x=task-0,task-0", r"--pool 'x=task-0,task-0': task\(s\) task-0 listed twice"),
        ("p=task-0,nonexistent", r"pool 'p': no stored runs of task\(s\) nonexistent; .* task-0, task-1"),
    ],
)
def test_pools_that_cannot_be_compared(
    stored: Path, pool: str, message: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(["compare", "--db", str(stored), "--pool", pool]) == 2
    assert __import__("re").search(message, " ".join(capsys.readouterr().err.split()))


# -- what already held, kept ----------------------------------------------------------------------------
def test_unknown_fields_wrong_types_and_names_still_fail(tmp_path: Path) -> None:
    path = _copy_builtin(tmp_path, "protocols", "protect-prompt")
    path.write_text(path.read_text().replace("buffer: 64", "buffer: lots\nbufer: 64"))
    with pytest.raises(SpecError) as caught:
        load_protocol(path)
    assert "field `buffer`: Input should be a valid integer" in str(caught.value)
    assert "field `bufer`: Extra inputs are not permitted (remove it" in str(caught.value)
    with pytest.raises(UnknownNameError, match="Did you mean 'passkey'"):
        _plan(tasks=("paskey",))


def test_python_tags_and_alias_bombs_are_refused(tmp_path: Path) -> None:
    tagged = tmp_path / "tagged.yaml"
    tagged.write_text("name: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(SpecError, match=r"not valid YAML.*could not determine a constructor"):
        load_model_spec(tagged)
    bomb = tmp_path / "bomb.yaml"
    levels = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    bomb.write_text("\n".join(levels) + "\n")
    with pytest.raises(SpecError, match="problem"):  # refused by validation, never expanded
        load_model_spec(bomb)
