"""Reasoning tasks load from hub-layout fixtures through the hub code path and render their prompt."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from invoke import kvbench

from kvbench.specs.task import load_task
from kvbench.specs.task_data import load_problems
from support import sandbox_expected

FIXTURES = Path(__file__).parent / "fixtures"
HUB = {
    "math500": "HuggingFaceH4/MATH-500",
    "gsm8k": "openai/gsm8k",
    "gpqa-diamond": "Idavidrein/gpqa",
    "aime25": "MathArena/aime_2025",
    "aime26": "MathArena/aime_2026",
    "hmmt25": "MathArena/hmmt_feb_2025",
    "lcb-v6": "livecodebench/code_generation_lite",
}


@pytest.mark.parametrize("task", list(HUB))
def test_task_loads_from_its_fixture(task: str) -> None:
    spec = load_task(task)
    problems = load_problems(spec, FIXTURES / "hub" / HUB[task])
    assert len(problems) >= 2 and len({p.problem_id for p in problems}) == len(problems)
    assert all("{question}" not in p.prompt and p.gold for p in problems)
    if spec.grader == "code":
        assert {p.problem_id for p in problems} == {"fx1", "fx2"}  # the medium ones, across the six files
    if spec.grader == "math":
        assert all(
            p.prompt.endswith("Please reason step by step, and put your final answer within \\boxed{}.")
            for p in problems
        )


def test_answers_are_read_as_documented() -> None:
    gsm8k = load_problems(load_task("gsm8k"), FIXTURES / "hub" / HUB["gsm8k"])
    assert [p.gold["answer"] for p in gsm8k] == ["72", "1000"]  # after '####', thousands separator dropped
    assert [p.problem_id for p in gsm8k] == ["test-0", "test-1"]
    aime = load_problems(load_task("aime25"), FIXTURES / "hub" / HUB["aime25"])
    assert [(p.problem_id, p.gold["answer"]) for p in aime] == [("1", "70"), ("2", "588")]


def test_gpqa_choices_are_shuffled_and_mapped_back() -> None:
    problems = load_problems(load_task("gpqa-diamond"), FIXTURES / "hub" / HUB["gpqa-diamond"])
    for i, problem in enumerate(problems):
        letter = problem.gold["answer"]
        assert f"({letter}) PRIVATE-CORRECT-{i}\n" in problem.prompt + "\n"
    assert {p.gold["answer"] for p in problems} != {"A"}


@pytest.mark.slow
@pytest.mark.parametrize("task", list(HUB))
def test_golden_prompt_with_the_smollm2_chat_template(task: str, smol) -> None:
    problem = load_problems(load_task(task), FIXTURES / "hub" / HUB[task])[0]
    rendered = smol.tokenizer.decode(smol.prompt_ids(problem.prompt))
    golden = FIXTURES / "golden" / f"{task}.txt"
    assert rendered == golden.read_text(), f"{task}: prompt changed; if on purpose, bump the task's version"


def test_a_private_task_stores_and_shows_no_text(tmp_path: Path) -> None:
    data = FIXTURES / "hub" / HUB["gpqa-diamond"]
    result = kvbench(
        "run",
        "--model",
        "tiny-qwen3",
        "--task",
        "gpqa-diamond",
        "--data",
        str(data),
        "--policy",
        "snapkv",
        "--budget",
        "384",
        "--max-new-tokens",
        "120",
        "--samples",
        "2",
        "--quiet",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "PRIVATE" not in result.stdout + result.stderr
    for path in (tmp_path / "runs").rglob("*"):
        if path.is_file():
            assert b"PRIVATE" not in path.read_bytes(), path
    con = duckdb.connect(str(tmp_path / "runs" / "kvbench.duckdb"), read_only=True)
    rows = con.execute("SELECT problem_id, output, secondary FROM samples").fetchall()
    assert len(rows) == 3 * 3 * 2
    assert all(output is None and "detail" not in secondary for _, output, secondary in rows)
    assert {problem for problem, _, _ in rows} == {"recFixture0", "recFixture1", "recFixture2"}


def test_livecodebench_tests_decode_from_both_encodings() -> None:
    problems = {p.problem_id: p for p in load_problems(load_task("lcb-v6"), FIXTURES / "hub" / HUB["lcb-v6"])}
    stdin, functional = problems["fx1"].gold, problems["fx2"].gold
    assert [t.output for t in stdin["tests"]] == ["7\n", "8\n"]  # public JSON + private base64/zlib/pickle
    assert functional["function"] == "scale" and [t.kind for t in functional["tests"]] == ["functional"] * 2


def test_a_pickled_dataset_field_cannot_load_code() -> None:
    import base64
    import pickle
    import zlib

    from kvbench.graders.code import decode_tests

    hostile = base64.b64encode(zlib.compress(pickle.dumps(print))).decode()
    with pytest.raises(pickle.UnpicklingError, match=r"refusing to load builtins\.print"):
        decode_tests(hostile)


def test_code_tasks_refuse_to_start_without_permission(tmp_path: Path) -> None:
    data = FIXTURES / "hub" / HUB["lcb-v6"]
    base = [
        "run",
        "--model",
        "tiny-qwen3",
        "--task",
        "lcb-v6",
        "--data",
        str(data),
        "--policy",
        "snapkv",
        "--budget",
        "384",
        "--max-new-tokens",
        "64",
        "--quiet",
    ]
    refused = kvbench(*base, cwd=tmp_path)
    assert refused.returncode == 2 and "--allow-code-execution" in refused.stderr
    assert not (tmp_path / "runs").exists()
    allowed = kvbench(*base, "--allow-code-execution", cwd=tmp_path)
    if sandbox_expected():
        assert allowed.returncode == 0, allowed.stderr
        assert "lcb-v6 on tiny-qwen3" in allowed.stdout
    else:  # no weaker fallback: without bubblewrap, code tasks refuse and say what to install
        assert allowed.returncode == 2 and "bubblewrap" in allowed.stderr, allowed.stderr
        assert not (tmp_path / "runs").exists()


def run_gsm8k_snapkv(folder: Path, *extra: str) -> Path:
    """kvbench run of snapkv alone on the GSM8K fixture in ``folder``; returns the fixture's path."""
    data = FIXTURES / "hub" / HUB["gsm8k"]
    args = ["--model", "tiny-qwen3", "--task", "gsm8k", "--data", str(data), "--policy", "snapkv"]
    run = kvbench("run", *args, "--budget", "384", "--no-baselines", "--quiet", *extra, cwd=folder)
    assert run.returncode == 0, run.stderr
    return data


def test_grade_regrades_stored_outputs_and_replaces_their_rows(tmp_path: Path) -> None:

    import pyarrow.parquet as pq

    run_gsm8k_snapkv(tmp_path, "--max-new-tokens", "40")
    (folder,) = (tmp_path / "runs" / "shards").iterdir()
    shard = sorted(folder.glob("*.parquet"))[0]
    rows = pq.read_table(shard).to_pylist()
    assert rows[0]["output"] and rows[0]["correct"] is False  # the tiny model writes noise
    rows[0].update(correct=True, metric=1.0)  # as a buggy grader might have said
    pq.write_table(pq.read_table(shard).from_pylist(rows, schema=pq.read_table(shard).schema), shard)
    assert kvbench("ingest", cwd=tmp_path).returncode == 0

    def stored() -> tuple:
        con = duckdb.connect(str(tmp_path / "runs" / "kvbench.duckdb"), read_only=True)
        try:
            query = "SELECT sum(metric), count(*), any_value(grader_version) FROM samples"
            return con.execute(query).fetchone()
        finally:
            con.close()

    assert stored()[:2] == (1.0, 2)
    graded = kvbench("grade", folder.name[:8], cwd=tmp_path)
    assert graded.returncode == 0, graded.stderr
    assert f"re-graded 2 samples of run {folder.name}: 1 verdicts changed" in graded.stdout
    total, count, grader = stored()
    assert (total, count) == (0.0, 2) and grader.startswith("math-1")


def test_a_correct_but_truncated_sample_is_correct_and_not_strict(tmp_path: Path) -> None:
    """Strict pass@1 counts only answers finished before the token cap: a right answer cut off at the cap
    is correct (pass@1) and not strict, in the shard, after re-grading, and in the summary."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kvbench.results.summary import summarize

    data = run_gsm8k_snapkv(tmp_path, "--max-new-tokens", "8", "--limit", "1")
    (folder,) = (tmp_path / "runs" / "shards").iterdir()
    (shard,) = folder.glob("*.parquet")
    rows = pq.read_table(shard).to_pylist()
    gold = load_problems(load_task("gsm8k"), data)[0].gold["answer"]
    assert rows[0]["finish_reason"] == "length" and json.loads(rows[0]["secondary"])["truncated"]
    rows[0]["output"] = f"So the answer is \\boxed{{{gold}}} and then"  # right, but cut at the cap
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_table(shard).schema), shard)
    graded = kvbench("grade", folder.name, cwd=tmp_path)
    assert graded.returncode == 0, graded.stderr
    (row,) = pq.read_table(shard).to_pylist()
    assert (row["correct"], row["strict_correct"], row["reason"]) == (True, False, None)
    con = duckdb.connect(str(tmp_path / "runs" / "kvbench.duckdb"), read_only=True)
    summary = summarize(con, [folder.name])[folder.name]
    con.close()
    assert list(summary.scores.values()) == [1.0] and list(summary.strict.values()) == [0.0]
    assert summary.truncation_rate == 1.0
