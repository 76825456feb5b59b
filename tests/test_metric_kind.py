"""A task's metric kind follows from what it computes, and a suite's task group of two kinds is refused
before anything runs (the pooled comparison itself: tests/leaderboard/test_pooling.py)."""

from __future__ import annotations

from pathlib import Path

from invoke import kvbench

from kvbench.specs.metric_kind import MetricKind, task_metric
from kvbench.specs.task import load_task, task_names


def test_each_shipped_task_has_the_kind_of_what_it_computes() -> None:
    kinds = {name: task_metric(load_task(name)) for name in task_names()}
    # the probes: exact retrieval of the needle, or agreement with the full cache token by token
    assert (kinds["passkey"].name, kinds["passkey"].kind) == ("exact", MetricKind.PASS_FAIL)
    assert kinds["planted-fact"].kind == MetricKind.PASS_FAIL
    assert (kinds["fidelity"].name, kinds["fidelity"].kind) == ("top1_agreement", MetricKind.PROPORTION)
    # every graded task's sample is right or wrong, whatever its YAML calls the metric
    graded = [n for n in kinds if load_task(n).grader in ("math", "choice", "code")]
    assert {"aime25", "gpqa-diamond", "gsm8k", "lcb-v6"} <= set(graded)
    assert {kinds[n].kind for n in graded} == {MetricKind.PASS_FAIL}
    # ranked by another quantity, every task carries that quantity's kind
    assert task_metric(load_task("fidelity"), "answer_logprob").kind == MetricKind.UNBOUNDED
    assert task_metric(load_task("gsm8k"), "needle_survival").kind == MetricKind.PROPORTION


def test_an_lm_eval_metric_is_read_by_its_name_and_an_unknown_one_pools_only_with_itself() -> None:
    task = load_task("passkey")
    source = {"kind": "lm-eval", "task": "kvb-echo"}
    lm_eval = {**task.model_dump(exclude={"margins"}), "source": source, "grader": "lm-eval", "metric": "f1"}
    f1 = task.model_validate(lm_eval)
    rouge = f1.model_copy(update={"metric": "rouge1_max"})
    assert task_metric(f1).kind == MetricKind.PROPORTION
    assert task_metric(rouge).kind == MetricKind.UNBOUNDED
    assert task_metric(rouge).pool != task_metric(rouge.model_copy(update={"metric": "bleu"})).pool


def test_a_suite_group_of_two_kinds_is_refused_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "mixed.yaml").write_text(
        "spec_version: 1\nname: mixed\ndescription: a group of two kinds\nmodels: [tiny-qwen3]\n"
        "tasks: [passkey, fidelity, planted-fact]\npolicies: [snapkv]\nprotocol: protect-prompt\nlimit: 1\n"
        "groups:\n  needles: [passkey, planted-fact]\n  probes: [passkey, fidelity]\n"
    )
    done = kvbench("run", "--suite", "mixed.yaml", "--quiet", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith(
        "kvbench: suite 'mixed', group 'probes', pools tasks whose metrics are of different kinds: "
        "passkey (pass/fail: exact), fidelity (proportion: top1_agreement)."
    ), done.stderr
    assert not (tmp_path / "runs").exists()  # refused at planning: not one unit ran
