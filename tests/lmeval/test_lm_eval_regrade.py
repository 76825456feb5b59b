"""`kvbench grade` with an unchanged grader changes nothing: a partial-credit metric (lm-eval's
letter_overlap) reads back after re-grading exactly as the run stored it, in the database a user queries."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from invoke import kvbench
from lm_eval_fixtures import letter_overlap

WORDS = ["apple", "river", "candle", "garden", "winter", "bridge", "pencil", "market"]


def stored(db: Path) -> dict[tuple[str, int], tuple[float, bool, str, str]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        query = "SELECT problem_id, sample, metric, correct, output, secondary FROM samples"
        return {(p, s): (m, c, o, x) for p, s, m, c, o, x in con.execute(query).fetchall()}
    finally:
        con.close()


@pytest.mark.slow
def test_regrading_an_lm_eval_run_keeps_its_partial_credit(lm_eval_dir: Path, tmp_path: Path) -> None:
    task = str(lm_eval_dir / "tasks" / "kvb-echo.yaml")
    args = ["run", "--task", task, "--policy", "snapkv", "--model", "tiny-qwen3", "--quiet", "--no-baselines"]
    done = kvbench(
        *args, "--budget", "128", "--max-new-tokens", "96", "--limit", "4", "--out", "out", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    db = tmp_path / "out" / "kvbench.duckdb"
    before = stored(db)
    assert len(before) == 4
    # the run's metric is lm-eval's letter_overlap, recomputed here by hand, and some of it is partial
    for (problem, _), (metric, *_, output, _) in before.items():
        assert metric == pytest.approx(letter_overlap(output, WORDS[int(problem)]))
    assert any(0.0 < metric < 1.0 for metric, *_ in before.values())

    (run,) = (tmp_path / "out" / "shards").iterdir()
    graded = kvbench("grade", run.name[:8], "--out", "out", cwd=tmp_path)
    assert graded.returncode == 0, graded.stderr[-3000:]
    assert f"re-graded 4 samples of run {run.name}: 0 verdicts changed" in graded.stdout
    after = stored(db)
    assert {key: row[0] for key, row in after.items()} == {key: row[0] for key, row in before.items()}
    assert after == before  # the verdict, the output and the grader's detail too, sample by sample
