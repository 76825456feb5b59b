"""lm-eval tasks as a kvbench task source: `kvbench run --task <lm-eval-sourced YAML>` end to end."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import duckdb
import pytest
from invoke import kvbench
from lm_eval_fixtures import letter_overlap

from kvbench.errors import SpecError
from kvbench.runner.plan import RunRequest, plan
from kvbench.specs.task import load_task

WORDS = ["apple", "river", "candle", "garden", "winter", "bridge", "pencil", "market"]


def rows(db: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.mark.slow
def test_run_lands_policy_null_and_full_and_compare_shows_them(
    lm_eval_dir: Path, tmp_path: Path, tiny
) -> None:
    task = str(lm_eval_dir / "tasks" / "kvb-echo.yaml")
    args = ["run", "--task", task, "--policy", "snapkv", "--model", "tiny-qwen3", "--quiet"]
    args += ["--budget", "128", "--max-new-tokens", "224", "--limit", "4", "--out", "out"]
    done = kvbench(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    db = tmp_path / "out" / "kvbench.duckdb"
    landed = rows(
        db,
        "SELECT r.role, r.policy, s.problem_id, s.sample, s.metric, s.evictions, s.generated_tokens,"
        " s.output, s.secondary FROM samples s JOIN runs r USING (run_id) ORDER BY ALL",
    )
    assert sorted({(role, policy) for role, policy, *_ in landed}) == [
        ("null", "random"),
        ("policy", "snapkv"),
        ("reference", "full"),
    ]
    assert len(landed) == 3 * 4
    for role, _, problem, sample, metric, evictions, generated, output, secondary in landed:
        word = WORDS[int(problem)]
        assert sample == 0
        assert metric == pytest.approx(letter_overlap(output, word))  # lm-eval's metric, by hand
        assert json.loads(secondary)["lm_eval_metrics"]["letter_overlap"] == pytest.approx(metric)
        prompt = len(tiny.prompt_ids(f"Repeat the word: {word}\nAnswer:"))  # lm-eval's prompt, templated
        expected = 0 if role == "reference" else max(0, (prompt + generated - 1 - 128) // 64)
        assert evictions == expected
    assert any(e > 0 for *_, e, _, _, _ in landed)

    (identity,) = {
        json.dumps(json.loads(spec)["lm_eval"], sort_keys=True)
        for (spec,) in rows(db, "SELECT spec FROM runs")
    }
    recorded = json.loads(identity)
    assert recorded["lm_eval_version"] == version("lm_eval") and recorded["task_version"] == "2.0"

    compared = kvbench("compare", "--db", str(db), "--format", "json", cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr
    (row,) = json.loads(compared.stdout)  # one policy row, paired with the null
    assert (row["task"], row["policy"], row["problems"], row["budget"]) == ("kvb-echo", "snapkv", 4, 128)
    snap = [m for role, _, _, _, m, *_ in landed if role == "policy"]
    null = [m for role, _, _, _, m, *_ in landed if role == "null"]
    assert row["delta"] == pytest.approx(sum(snap) / 4 - sum(null) / 4)

    again = kvbench(*args, cwd=tmp_path)
    assert again.returncode == 0 and "0 problems computed, 12 reused" in again.stdout


@pytest.mark.slow
def test_every_sample_of_lm_evals_repeats_is_scored(lm_eval_dir: Path, tmp_path: Path) -> None:
    task = str(lm_eval_dir / "tasks" / "kvb-echo-samples.yaml")
    args = ["run", "--task", task, "--policy", "snapkv", "--model", "tiny-qwen3", "--quiet"]
    args += ["--budget", "128", "--limit", "2", "--out", "out", "--no-baselines"]
    done = kvbench(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    landed = rows(
        tmp_path / "out" / "kvbench.duckdb",
        "SELECT problem_id, sample, metric, output FROM samples ORDER BY ALL",
    )
    assert [(p, s) for p, s, _, _ in landed] == [(p, s) for p in ("0", "1") for s in range(3)]
    for problem, _, metric, output in landed:
        assert metric == pytest.approx(letter_overlap(output, WORDS[int(problem)]))
    assert len({output for *_, output in landed}) == 6  # sampled at the task's temperature 1.0


def _plan(task: str | Path, **request) -> list:
    return plan(
        RunRequest(tasks=(str(task),), policies=("snapkv",), models=("tiny-qwen3",), budget=128, **request)
    )


def test_lm_eval_fills_length_and_samples_and_its_version_is_identity(
    lm_eval_dir: Path, tmp_path: Path
) -> None:
    samples_task = lm_eval_dir / "tasks" / "kvb-echo-samples.yaml"
    cell = _plan(samples_task)[0]
    assert (cell.task.max_new_tokens, cell.samples) == (96, 3)  # lm-eval's max_gen_toks and repeats
    assert cell.spec.record()["lm_eval"]["generation_kwargs"]["temperature"] == 1.0
    assert _plan(samples_task, max_new_tokens=40)[0].task.max_new_tokens == 40

    # the same kvbench YAML over an lm-eval task whose version moved: every run id moves
    copy = tmp_path / "copy"
    for folder in ("tasks", "lm_eval_tasks"):
        (copy / folder).mkdir(parents=True)
        for file in (lm_eval_dir / folder).iterdir():
            (copy / folder / file.name).write_text(file.read_text())
    echo = copy / "lm_eval_tasks" / "kvb_echo.yaml"
    echo.write_text(echo.read_text().replace("version: 2.0", "version: 3.0"))
    before = _plan(lm_eval_dir / "tasks" / "kvb-echo.yaml")
    after = _plan(copy / "tasks" / "kvb-echo.yaml")
    assert after[0].spec.record()["lm_eval"]["task_version"] == "3.0"
    assert {c.run_id for c in before}.isdisjoint(c.run_id for c in after)


def _spec(tmp_path: Path, lm_eval_dir: Path, body: str) -> Path:
    path = tmp_path / "task.yaml"
    include = lm_eval_dir / "lm_eval_tasks"
    path.write_text(
        "spec_version: 1\nname: probe-of-rules\ndescription: a test task\nlicence: test\n"
        + body.replace("@INCLUDE@", str(include))
    )
    return path


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "source: {kind: lm-eval, task: kvb_echo, include: '@INCLUDE@'}\ngrader: lm-eval\nmetric: bleu\n",
            r"`metric: bleu` is not a metric of lm-eval's 'kvb_echo' "
            r"\(its metrics: letter_overlap, exact_match\)",
        ),
        (
            "source: {kind: lm-eval, task: kvb_choice, include: '@INCLUDE@'}\ngrader: lm-eval\nmetric: acc\n",
            r"asks for multiple_choice requests.*kvbench lm-eval --model kvbench",
        ),
        (
            "source: {kind: lm-eval, task: kvb_shuffled, include: '@INCLUDE@'}\ngrader: lm-eval\n"
            "metric: letter_overlap\n",
            r"gives its documents in a different order or content each time",
        ),
        (
            "source: {kind: lm-eval, task: kvb_nothing, include: '@INCLUDE@'}\ngrader: lm-eval\nmetric: x\n",
            r"lm-eval knows no task 'kvb_nothing'",
        ),
        (
            "source: {kind: lm-eval, task: kvb_echo, include: '@INCLUDE@', filter: strict}\n"
            "grader: lm-eval\nmetric: exact_match\n",
            r"has no filter 'strict' \(its filters: none\)",
        ),
    ],
)
def test_what_kvbench_cannot_score_fairly_is_refused(
    lm_eval_dir: Path, tmp_path: Path, body: str, message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        _plan(_spec(tmp_path, lm_eval_dir, body))


def test_spec_rules_for_an_lm_eval_source(lm_eval_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"an lm-eval source renders its own prompts: remove `prompt`"):
        load_task(
            _spec(
                tmp_path,
                lm_eval_dir,
                "source: {kind: lm-eval, task: kvb_echo}\ngrader: lm-eval\nmetric: x\n"
                "prompt: '{question}!'\n",
            )
        )
    with pytest.raises(SpecError, match=r"graded by 'lm-eval' or 'math', not 'choice'"):
        load_task(
            _spec(
                tmp_path, lm_eval_dir, "source: {kind: lm-eval, task: kvb_echo}\ngrader: choice\nmetric: x\n"
            )
        )
    with pytest.raises(SpecError, match=r"--data does not apply|hub-dataset task"):
        _plan(lm_eval_dir / "tasks" / "kvb-echo.yaml", data=str(tmp_path))


def test_an_lm_eval_task_graded_by_kvbenchs_math_grader(lm_eval_dir: Path) -> None:
    from kvbench.graders.registry import make_grader
    from kvbench.runner.sources import task_source

    task = load_task(lm_eval_dir / "tasks" / "kvb-letters.yaml")
    problems = task_source(task).problems(task, None, 3, None, None)
    assert [p.gold["answer"] for p in problems] == [str(len(w)) for w in WORDS[:3]]
    assert problems[0].prompt == "How many letters are in the word apple?\nAnswer:"
    assert problems[0].stop == ("\n\n",)
    grader = make_grader("math")
    try:
        right = grader.grade("It has \\boxed{5} letters.", problems[0].gold, task, thinking=False)
        wrong = grader.grade("It has \\boxed{6} letters.", problems[0].gold, task, thinking=False)
    finally:
        grader.close()
    assert (right.correct, right.score, wrong.correct, wrong.score) == (True, 1.0, False, 0.0)


def test_validate_loads_the_lm_eval_task_behind_a_spec(lm_eval_dir: Path) -> None:
    from kvbench.runner.sources import resolved_task
    from kvbench.specs.validate import validate_paths

    assert validate_paths(lm_eval_dir / "tasks" / "kvb-echo.yaml", check_task=resolved_task) == [
        ("task", "kvb-echo")
    ]
    with pytest.raises(SpecError, match=r"kvb-shuffled.*different order or content"):
        validate_paths(lm_eval_dir / "tasks" / "kvb-shuffled.yaml", check_task=resolved_task)
