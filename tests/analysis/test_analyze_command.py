"""`kvbench analyze values` end to end on tiny-qwen3: the table in the store, the figures on disk."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from invoke import kvbench


@pytest.mark.slow
def test_analyze_values_stores_a_tidy_table_and_draws_figures(tmp_path: Path, tiny) -> None:
    from kvbench.probes.problems import fidelity_problem
    from kvbench.specs.task import load_task

    args = ["analyze", "values", "--model", "tiny-qwen3", "--task", "fidelity", "--limit", "1"]
    args += ["--group", "16", "--db", "runs", "--out", "figures"]
    done = kvbench(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    con = duckdb.connect(str(tmp_path / "runs" / "kvbench.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT model, task, layer, head, statistic, value, tokens, provenance, settings FROM value_analysis"
    ).fetchall()
    con.close()
    assert {(r[0], r[1]) for r in rows} == {("tiny-qwen3", "fidelity")}
    keys = [(r[2], r[3], r[4]) for r in rows]
    assert len(keys) == len(set(keys))  # one row per (layer, head, statistic)
    assert {r[2] for r in rows} == {0, 1} and {r[3] for r in rows} == {None, 0, 1}  # 2 layers, 2 KV heads
    correlations = {(r[2], r[4]): r[5] for r in rows if r[3] is None and r[4].startswith("pearson")}
    assert set(correlations) == {
        (layer, f"pearson_range_v_error_{b}bit") for layer in (0, 1) for b in (2, 4, 8)
    }
    assert all(-1 <= v <= 1 for v in correlations.values())
    # the trace is the probe's prompt through the chat template, then its continuation
    source = load_task("fidelity").probe
    encode = lambda text: list(tiny.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    problem = fidelity_problem(
        0, seed=source.seed, length=source.length, count_tokens=lambda t: len(encode(t))
    )
    expected = len(tiny.prompt_ids(problem.stub)) + sum(len(ids) for _, ids in problem.token_pieces(encode))
    assert {r[6] for r in rows} == {expected}
    machine = json.loads(rows[0][7])["hardware"]
    assert machine["torch_threads"] >= 1 and machine["device"] == "cpu"  # where --device put the model
    assert json.loads(rows[0][8]) == {"above": 4.0, "bins": 8, "bits": [2, 4, 8], "group": 16, "limit": 1}
    figures = sorted(p.name.split("-", 1)[1] for p in (tmp_path / "figures").glob("*.html"))
    assert figures == ["correlation.html", "histograms.html", "positions.html"]
