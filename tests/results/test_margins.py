"""Equivalence margins in the metric's units: a task declares one per metric (``margins``), a metric
scored in [0, 1] without one uses the protocol's, an unbounded one without one has no equivalence test;
`kvbench compare` and the leaderboard test with it, show it, and say which spec field declared it. The
expected p-values are computed here with a bootstrap-t written out in numpy and Holm by its definition."""

from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb
import invoke
import pytest
import yaml
from bootstrap_by_hand import bootstrap_tost

from kvbench.bench.leaderboard import synthetic_store
from kvbench.errors import SpecError
from kvbench.specs.protocol import load_protocol
from kvbench.specs.task import load_task
from support import holm_by_definition

TASKS = Path(__file__).resolve().parents[2] / "tasks"
PROTOCOL_MARGIN = load_protocol("protect-prompt").margin
PROBLEMS = 40
SHIFT = {"policy-00": 0.05, "policy-01": -0.5}
"""Each policy's answer log-probability above the null's on every problem, give or take 0.005."""


def declared(task: str, metric: str) -> float:
    """The margin a task's YAML declares for a metric, read from the file itself."""
    return yaml.safe_load((TASKS / f"{task}.yaml").read_text())["margins"][metric]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic store of the passkey task (its spec, margins included): a null, two policies and the
    full cache on 40 problems, their log-probabilities and needle survival written here."""
    database = tmp_path_factory.mktemp("margins") / "store.duckdb"
    synthetic_store(database, policies=2, tasks=1, problems=PROBLEMS, samples=1)
    with duckdb.connect(str(database)) as con:
        for run_id, policy in con.execute("SELECT run_id, policy FROM runs").fetchall():
            for p in range(PROBLEMS):
                base = -3.0 + 0.3 * math.sin(p)
                shift = SHIFT.get(policy, 0.0) + 0.005 * math.cos(3 * p) * (policy in SHIFT)
                survival = 0.5 + 0.01 * math.sin(2 * p) + (0.2 if policy == "policy-01" else 0.0)
                con.execute(
                    "UPDATE samples SET answer_logprob = ?, needle_survival = ? "
                    "WHERE run_id = ? AND problem_id = ?",
                    [base + shift, survival, run_id, f"p{p}"],
                )
    return database


def compare_json(database: Path, *args: str, cwd: Path) -> dict[str, dict]:
    done = invoke.kvbench("compare", "--db", str(database), "--format", "json", *args, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return {row["policy"]: row for row in json.loads(done.stdout)}


def deltas(database: Path, policy: str, column: str) -> list[float]:
    """The policy's ``column`` minus the null's per problem, in SQL, in problem-id order."""
    with duckdb.connect(str(database), read_only=True) as con:
        rows = con.execute(
            f"SELECT a.{column} - b.{column} FROM samples a JOIN runs ra USING (run_id), samples b "
            "JOIN runs rb ON b.run_id = rb.run_id WHERE a.problem_id = b.problem_id AND ra.policy = ? "
            "AND rb.role = 'null' ORDER BY a.problem_id",
            [policy],
        ).fetchall()
    return [d for (d,) in rows]


def test_answer_logprob_is_tested_at_its_own_declared_margin(store: Path, tmp_path: Path) -> None:
    margin = declared("passkey", "answer_logprob")
    assert margin != PROTOCOL_MARGIN  # else this test could not tell the two apart
    rows = compare_json(store, "--metric", "answer-logprob", cwd=tmp_path)
    expected = holm_by_definition([bootstrap_tost(deltas(store, p, "answer_logprob"), margin) for p in SHIFT])
    for (policy, row), p_holm in zip(sorted(rows.items()), expected, strict=True):
        assert row["margin"] == margin
        assert row["margin_from"] == "task task-0: margins.answer_logprob"
        assert row["p_equivalence_holm"] == pytest.approx(p_holm, rel=1e-12), policy
    # +0.05 nats on every problem: a real difference, inside ±0.1, so the badge says so; at the
    # protocol's ±0.02 the same differences would not be equivalent
    assert rows["policy-00"]["verdict"] == "practically equivalent"
    assert bootstrap_tost(deltas(store, "policy-00", "answer_logprob"), PROTOCOL_MARGIN) > 0.05
    assert rows["policy-01"]["verdict"] == "loses to null"
    # the terminal table says which margin it used and where it was declared
    done = invoke.kvbench("compare", "--db", str(store), "--metric", "answer-logprob", cwd=tmp_path)
    assert f"equivalence margin ±{margin:g}: task task-0: margins.answer_logprob" in " ".join(
        done.stdout.split()
    )


def test_the_leaderboard_uses_the_same_margin_and_badge(store: Path) -> None:
    from kvbench.leaderboard import queries
    from kvbench.leaderboard.queries import Compression

    board = queries.leaderboard(
        store, "synthetic", "protect-prompt", Compression(4.0, None), quantity="answer-logprob"
    ).frame.set_index("policy")
    assert board.loc["policy-00", "margin"] == declared("passkey", "answer_logprob")
    assert board.loc["policy-00", "verdict"] == "practically equivalent"


def test_a_bounded_quantity_without_a_declared_margin_uses_the_protocols(store: Path, tmp_path: Path) -> None:
    rows = compare_json(store, "--metric", "needle-survival", cwd=tmp_path)
    for row in rows.values():
        assert row["margin"] == PROTOCOL_MARGIN
        assert row["margin_from"] == "protocol protect-prompt: margin"


def test_an_unbounded_metric_without_a_declared_margin_has_no_equivalence_test(
    store: Path, tmp_path: Path
) -> None:
    """The same store with the task's margins taken out of every stored spec (runs made before a task
    declared one): answer-logprob has no margin, so nothing is called equivalent and no badge is given."""
    bare = tmp_path / "bare.duckdb"
    bare.write_bytes(store.read_bytes())
    with duckdb.connect(str(bare)) as con:
        for run_id, spec in con.execute("SELECT run_id, spec FROM runs").fetchall():
            record = json.loads(spec)
            del record["task"]["margins"]
            con.execute("UPDATE runs SET spec = ? WHERE run_id = ?", [json.dumps(record), run_id])
    rows = compare_json(bare, "--metric", "answer-logprob", cwd=tmp_path)
    for row in rows.values():
        assert math.isnan(row["margin"]) and row["p_equivalence_holm"] == 1.0
        assert row["margin_from"] == (
            "none: answer_logprob is not scored in [0, 1] and task task-0 declares no margins.answer_logprob"
        )
    assert rows["policy-00"]["verdict"] == "beats null"


@pytest.mark.parametrize(
    ("margins", "says"),
    [
        (
            "{answer_lgprob: 0.1}",
            "`margins.answer_lgprob`: this task has no metric 'answer_lgprob'; its metrics",
        ),
        ("{exact: 1.5}", "`margins.exact` is 1.5, but exact is a pass/fail metric scored in [0, 1]"),
        ("{answer_logprob: -0.1}", "field `margins.answer_logprob`: Input should be greater than 0"),
    ],
)
def test_a_bad_margin_is_refused_naming_the_file_the_field_and_the_fix(
    tmp_path: Path, margins: str, says: str
) -> None:
    text = (TASKS / "passkey.yaml").read_text()
    head = text[: text.index("margins:")]
    path = tmp_path / "passkey-bad.yaml"
    path.write_text(head + f"margins: {margins}\n")
    with pytest.raises(SpecError) as raised:
        load_task(path)
    message = str(raised.value)
    assert str(path) in message and says in message, message


def test_a_fidelity_probe_has_no_needle_quantities_to_declare(tmp_path: Path) -> None:
    path = tmp_path / "fidelity.yaml"
    path.write_text((TASKS / "fidelity.yaml").read_text() + "margins: {needle_survival: 0.05}\n")
    with pytest.raises(SpecError, match="its metrics are top1_agreement: key each margin by one of those"):
        load_task(path)


def test_the_needle_quantities_a_margin_can_name_are_those_compare_ranks_by() -> None:
    from kvbench.results.summary import QUANTITIES
    from kvbench.specs.metric_kind import NEEDLE_QUANTITIES, TASK_METRIC

    assert set(QUANTITIES.values()) - {TASK_METRIC} == set(NEEDLE_QUANTITIES)
