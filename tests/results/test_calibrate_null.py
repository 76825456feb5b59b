"""`kvbench calibrate-null` on the seeded tiny Qwen3: the null against itself at disjoint pairs of
protocol seeds must come out "beats" or "loses" no more often than α, over enough comparisons to tell a
5% rate from 15%; its seeds must be exchangeable; and with the true difference moved onto the margin,
*equivalent* must come out at most α of the time. Every comparison is recomputed here from the stored
samples: scipy's sign test, a bootstrap-t TOST and a permutation test written out in numpy."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pytest
from bootstrap_by_hand import bootstrap_tost
from invoke import kvbench
from scipy.stats import binomtest

PAIRS = 24
"""With no false positive in 24 comparisons the upper 95% Clopper-Pearson bound is 14.2%: below 15%."""
TASK = """
spec_version: 1
name: aa-fidelity
version: 1
description: The fidelity probe on a 512-token trace, 30 problems (A/A pairs in CI).
source: {kind: probe, probe: fidelity, problems: 30, length: 512}
metric: top1_agreement
samples: 1
"""
SUITE = """
spec_version: 1
name: aa
description: The null against itself in CI
models: [tiny-qwen3]
tasks: [{task}]
policies: [streaming]
protocol: protect-prompt
ratios: [2]
limit: 30
"""
PROBLEMS = 30
"""The fewest at which the bootstrap-t declares equivalence: the injected shift can then be measured."""


@pytest.mark.slow
def test_the_null_against_itself_is_called_different_at_most_alpha_of_the_time(tmp_path: Path) -> None:
    (tmp_path / "aa-fidelity.yaml").write_text(TASK)
    (tmp_path / "aa.yaml").write_text(SUITE.format(task=tmp_path / "aa-fidelity.yaml"))
    done = kvbench(
        "calibrate-null",
        "--suite",
        "aa.yaml",
        "--pairs",
        str(PAIRS),
        "--json",
        "aa.json",
        "--quiet",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "aa.json").read_text())

    con = duckdb.connect(str(tmp_path / "runs" / "calibration" / "kvbench.snapshot.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT r.protocol_seed, s.problem_id, avg(s.metric) FROM samples s JOIN runs r USING (run_id) "
        "WHERE r.policy = 'random' GROUP BY ALL"
    ).fetchall()
    scores: dict[int, dict[str, float]] = {}
    for seed, problem, score in rows:
        scores.setdefault(seed, {})[problem] = score
    assert sorted(scores) == list(range(2 * PAIRS)) and all(len(s) == PROBLEMS for s in scores.values())
    # a probe's K is fixed: no full-cache arm was run for it
    assert con.execute("SELECT DISTINCT policy FROM runs").fetchall() == [("random",)]
    different, discordant, testable = 0, 0, 0
    for i in range(PAIRS):  # disjoint pairs: seeds 2i and 2i + 1
        a, b = scores[2 * i], scores[2 * i + 1]
        wins = sum(a[p] > b[p] + 1e-9 for p in a)
        losses = sum(a[p] < b[p] - 1e-9 for p in a)
        discordant += wins + losses > 0
        testable += wins + losses >= 6  # fewer differing problems: the sign test cannot reach p < 0.05
        different += wins + losses > 0 and binomtest(wins, wins + losses).pvalue < 0.05
    # the seeds do change what the null keeps: most pairs disagree somewhere, so a rejection was possible
    assert discordant >= PAIRS // 2
    calibration = report["calibration"]
    assert calibration["comparisons"] == len(report["comparisons"]) == PAIRS
    assert calibration["testable"] == testable
    # a decided difference needs the sign test and the mean test: never more often than the sign test
    assert calibration["false_positive_rate"] * testable <= different
    assert calibration["false_positive_rate"] <= 0.05
    assert f"over {testable} of {PAIRS} comparisons" in done.stdout

    # the seeds are exchangeable: a permutation test written out here (each problem's scores shuffled
    # across the 48 seeds) agrees with the report within Monte Carlo error, and does not reject
    exchange = report["exchangeability"]
    matrix = np.array([[scores[seed][p] for seed in sorted(scores)] for p in sorted(scores[0])])
    assert exchange["p_value"] == pytest.approx(permutation_p(matrix), abs=0.03)
    assert exchange["p_value"] > 0.01 and exchange["seeds"] == 2 * PAIRS
    # equivalence with the true difference on the margin: the second seed of each pair moved by ±margin
    # (up for even pairs), each pair judged alone; the count recomputed with a TOST written out here
    shift = report["injected_shift"]
    margin = 0.02  # the protocol's: fidelity's top-1 agreement is a proportion and the task declares none
    equivalent = 0
    for i in range(PAIRS):
        a, b = scores[2 * i], scores[2 * i + 1]
        moved = {p: b[p] + (margin if i % 2 == 0 else -margin) for p in b}
        equivalent += bootstrap_tost([a[p] - moved[p] for p in sorted(a)], margin) < 0.05
    assert (shift["comparisons"], shift["equivalent"], shift["left_out"]) == (PAIRS, equivalent, 0)
    assert shift["rate"] <= 0.05 and shift["high"] < 0.15
    assert f"{equivalent} of {PAIRS} pairs" in " ".join(done.stdout.split())


def permutation_p(matrix: np.ndarray, draws: int = 10_000) -> float:
    """(1 + #{shuffles with a spread of seed means at least the observed})/(1 + draws), each problem's
    row shuffled on its own, one shuffle at a time."""
    rng = np.random.default_rng(12345)

    def spread(m: np.ndarray) -> float:
        return float(np.var(m.mean(axis=0)))

    observed = spread(matrix)
    at_least = sum(
        spread(np.array([rng.permutation(row) for row in matrix])) >= observed - 1e-12 for _ in range(draws)
    )
    return (1 + at_least) / (1 + draws)


def test_a_full_cache_arm_is_run_only_where_the_nulls_budget_waits_on_it(tmp_path: Path) -> None:
    """A generated task's K follows its full cache's measured N_avg at each seed, so that arm runs with
    it; a probe's K is the trace's, so its full cache is left out."""
    import argparse

    from kvbench.commands.calibrate import replicate_cells

    suite = tmp_path / "mixed.yaml"
    suite.write_text(
        "spec_version: 1\nname: mixed\ndescription: a generated task and a probe\nmodels: [tiny-qwen3]\n"
        "tasks: [gsm8k, passkey]\npolicies: [snapkv]\nprotocol: protect-prompt\nlimit: 2\n"
    )
    cells = replicate_cells(argparse.Namespace(suite=str(suite), model=[], task=[], limit=None, pairs=2))
    planned = sorted((c.protocol.seed, c.task.name, c.role.value, c.policy.name) for c in cells)
    assert planned == [
        (seed, task, role, policy)
        for seed in range(4)
        for task, role, policy in [
            ("gsm8k", "null", "random"),
            ("gsm8k", "reference", "full"),
            ("passkey", "null", "random"),
        ]
    ]
    full = {c.run_id for c in cells if c.role.value == "reference"}
    assert {c.pending.reference_run for c in cells if c.pending is not None} == full
