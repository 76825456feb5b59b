"""The Retention view on the runner-written database (conftest.py): its numbers against plain SQL over the
samples, streaming's coverage against theory, and the null's row first."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from boardtest import _decoded, open_app, tab

from kvbench.adapters.hf.models import load_model


def _sql_mean(database: Path, policy: str, column: str) -> float:
    """The mean over the policy's 2x protect-prompt tiny-qwen3 samples and their layers."""
    con = duckdb.connect(str(database), read_only=True)
    try:
        (value,) = con.execute(
            f"SELECT avg(v) FROM (SELECT unnest(s.{column}) AS v FROM samples s JOIN runs r USING (run_id) "
            "WHERE r.model = 'tiny-qwen3' AND r.protocol = 'protect-prompt' AND r.ratio = 2 "
            "AND r.policy = ?)",
            [policy],
        ).fetchone()
    finally:
        con.close()
    return value


def test_the_retention_view_shows_each_policy_beside_the_null(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch, url={"compression": "2x"})
    view = tab(app, "Retention")
    table = view.dataframe[0].value
    assert table["policy"].iloc[0] == "random (null)"  # the row every policy is read against, first
    assert not [c for c in table.columns if "(null)" in c]  # not again beside each column: it fits 1280 px
    rows = {r["policy"]: r for r in table.to_dict("records")}
    assert {"streaming", "snapkv", "random (null)"} <= set(rows)
    for label, policy in (("streaming", "streaming"), ("snapkv", "snapkv"), ("random (null)", "random")):
        assert rows[label]["coverage"] == pytest.approx(
            _sql_mean(board_db, policy, "head_coverage"), rel=1e-6
        )
        assert rows[label]["prompt held (every head)"] == pytest.approx(
            _sql_mean(board_db, policy, "prompt_held_all"), rel=1e-6
        )
    # streaming keeps the protected prompt and one suffix in every KV head: coverage 1/Hkv exactly
    heads = load_model("tiny-qwen3").facts.num_kv_heads
    assert rows["streaming"]["coverage"] == pytest.approx(1 / heads, rel=1e-6)
    assert rows["random (null)"]["coverage"] > 1 / heads
    assert rows["snapkv"]["prompt held (every head)"] == pytest.approx(1.0)  # the protocol protects it
    charts = {json.loads(c.proto.spec)["layout"]["title"]["text"]: c for c in view.get("plotly_chart")}
    assert {"cross-head coverage", "survival by age", "recall against eviction events"} <= set(charts)
    traces = {t["name"]: t for t in json.loads(charts["survival by age"].proto.spec)["data"]}
    assert {"streaming", "snapkv", "random (null)"} <= set(traces)
    ages = _decoded(traces["streaming"]["y"])
    assert len(ages) == 10 and ages[-1] > ages[len(ages) // 2]  # streaming keeps the newest, drops the middle
