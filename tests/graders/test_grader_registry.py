"""Graders by registry: a task's `grader:` is looked up by name with its required columns checked, loading
a spec imports no grading code, and whether a model thinks comes from its YAML (graded accordingly)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from invoke import kvbench

from kvbench.errors import SpecError
from kvbench.runner.plan import RunRequest, plan
from kvbench.specs.model import load_model_spec
from kvbench.specs.task import load_task

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT / "tests" / "fixtures" / "hub" / "openai" / "gsm8k"


def task_with(tmp_path: Path, old: str, new: str) -> Path:
    text = (ROOT / "tasks" / "gsm8k.yaml").read_text()
    assert old in text
    path = tmp_path / "task.yaml"
    path.write_text(text.replace(old, new))
    return path


def test_an_unknown_grader_is_named_with_the_known_ones(tmp_path: Path) -> None:
    path = task_with(tmp_path, "grader: math", "grader: maths")
    with pytest.raises(SpecError) as caught:
        load_task(path)
    message = str(caught.value)
    assert str(path) in message and "grader" in message
    known = "Known graders: choice, code, lm-eval, math, probe."
    assert f"unknown grader 'maths'. Did you mean 'math'? {known}" in message


def test_a_grader_names_the_columns_it_needs(tmp_path: Path) -> None:
    path = task_with(tmp_path, "grader: math", "grader: choice")
    with pytest.raises(SpecError, match=r"a choice task needs `fields\.correct` and `fields\.incorrect`"):
        load_task(path)


def test_a_field_the_grader_does_not_read_is_refused(tmp_path: Path) -> None:
    # a code task's test column on a math task would be silently ignored: the YAML is wrong
    path = task_with(tmp_path, 'answer_after: "####"}', 'answer_after: "####", tests: [answer]}')
    with pytest.raises(SpecError) as caught:
        load_task(path)
    message = str(caught.value)
    assert str(path) in message
    assert "the math grader does not read `fields.tests`: remove it" in message
    assert "(a math task's fields: answer, answer_after, id, question)" in message
    # the grader's optional fields are accepted (gsm8k sets answer_after)
    assert load_task(ROOT / "tasks" / "gsm8k.yaml").dataset.fields.answer_after == "####"


def test_loading_specs_imports_no_grading_code() -> None:
    script = (
        "import sys; from kvbench.specs.task import load_task; [load_task(t) for t in "
        "('gsm8k', 'gpqa-diamond', 'lcb-v6', 'passkey')]; "
        "print([m for m in sys.modules if m.startswith(('kvbench.graders.math', 'kvbench.graders.code', "
        "'kvbench.graders.choice', 'math_verify'))])"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_thinking_comes_from_the_model_yaml_and_only_set_fields_join_the_identity(tmp_path: Path) -> None:
    qwen3 = load_model_spec("qwen3-4b")
    assert qwen3.thinking and qwen3.chat_template_args == {"enable_thinking": True}
    tiny = load_model_spec("tiny-qwen3")
    assert not tiny.thinking and "thinking" not in tiny.model_dump(mode="json")
    thinking = tmp_path / "tiny-thinking.yaml"
    text = (ROOT / "suite" / "models" / "tiny-qwen3.yaml").read_text().replace("name: tiny-qwen3", "name: tt")
    thinking.write_text(text + "thinking: true\n")
    request = dict(tasks=("gsm8k",), policies=("snapkv",), baselines=False, data=str(GSM8K))
    (plain,) = plan(RunRequest(models=("tiny-qwen3",), **request))
    (thinks,) = plan(RunRequest(models=(str(thinking),), **request))
    assert (
        plain.spec.record()["model"]["name"] == "tiny-qwen3"
        and "thinking" not in plain.spec.record()["model"]
    )
    assert thinks.spec.record()["model"]["thinking"] is True


@pytest.mark.slow
def test_a_thinking_models_answer_is_read_after_its_marker(tmp_path: Path) -> None:
    from kvbench.specs.task_data import load_problems
    from kvbench.store.shards import ShardStore, read_records

    thinking = tmp_path / "tiny-thinking.yaml"
    text = (ROOT / "suite" / "models" / "tiny-qwen3.yaml").read_text().replace("name: tiny-qwen3", "name: tt")
    thinking.write_text(text + "thinking: true\n")
    args = ["--model", str(thinking), "--task", "gsm8k", "--data", str(GSM8K), "--policy", "snapkv"]
    args += ["--budget", "384", "--max-new-tokens", "8", "--limit", "1", "--samples", "2", "--no-baselines"]
    done = kvbench("run", *args, "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (manifest,) = (tmp_path / "runs" / "shards").glob("*/manifest.json")
    assert json.loads(manifest.read_text())["thinking"] is True
    # the same right answer, once after the thinking marker and once without it
    (problem,) = load_problems(load_task("gsm8k"), GSM8K, 1)
    (shard,) = manifest.parent.glob("*.parquet")
    records = read_records(shard)
    answer = f"\\boxed{{{problem.gold['answer']}}}"
    outputs = [f"reasoning</think> The answer is {answer}", f"The answer is {answer}"]
    edited = [r.model_copy(update={"output": o}) for r, o in zip(records, outputs, strict=True)]
    ShardStore(tmp_path / "runs", manifest.parent.name).write(problem.problem_id, edited)
    graded = kvbench("grade", manifest.parent.name, cwd=tmp_path)
    assert graded.returncode == 0, graded.stderr
    con = duckdb.connect(str(tmp_path / "runs" / "kvbench.duckdb"), read_only=True)
    rows = con.execute("SELECT sample, correct, no_answer FROM samples ORDER BY sample").fetchall()
    con.close()
    assert rows == [(0, True, False), (1, False, True)]
