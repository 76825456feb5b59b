"""A probe generates as many problems as a run asks for: `--limit` above the task's `problems` is honoured,
never cut to it (issue 44: `--limit 10` on a four-problem probe silently ran 4), and the first problems
are the same whatever the count, so a larger limit extends a stored run."""

from __future__ import annotations

from pathlib import Path

import duckdb

from kvbench.cli import main
from kvbench.probes.problems import fidelity_problem
from kvbench.runner.probe_units import make_probe_problems
from kvbench.specs.task import ProbeSource


def _words(text: str) -> list[int]:
    return [len(word) for word in text.split()]


def test_a_limit_above_the_default_generates_that_many() -> None:
    source = ProbeSource(kind="probe", probe="fidelity", problems=2, length=64)
    default = make_probe_problems(source, None, _words)
    more = make_probe_problems(source, 5, _words)
    assert [p.problem_id for p in default] == ["fidelity-0-0", "fidelity-0-1"]
    assert [p.problem_id for p in more] == [f"fidelity-0-{i}" for i in range(5)]
    assert more[:2] == default
    assert more[4] == fidelity_problem(4, seed=0, length=64, count_tokens=lambda t: len(_words(t)))


def test_a_run_stores_every_problem_its_limit_asks_for(tmp_path: Path) -> None:
    task = tmp_path / "tasks" / "short-fidelity.yaml"
    task.parent.mkdir()
    task.write_text(
        "spec_version: 1\nname: short-fidelity\ndescription: d\nmetric: top1_agreement\n"
        "source: {kind: probe, probe: fidelity, problems: 2, length: 256}\n"
    )
    out = tmp_path / "runs"
    run = ["run", "--model", "tiny-qwen3", "--quiet", "--task", str(task), "--policy", "streaming"]
    assert main([*run, "--budget", "192", "--limit", "3", "--out", str(out)]) == 0
    with duckdb.connect(str(out / "kvbench.duckdb"), read_only=True) as db:
        stored = db.execute("SELECT DISTINCT problem_id FROM samples ORDER BY problem_id").fetchall()
    assert [row[0] for row in stored] == ["fidelity-0-0", "fidelity-0-1", "fidelity-0-2"]
