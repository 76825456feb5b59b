"""`kvbench analyze values` records the machine its model ran on: the device in every row's provenance is
the analysis's own, not "cpu" whatever the device."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from kvbench.analysis.collect import Analysis, write_table
from kvbench.analysis.values import Stat
from kvbench.store.ingest import ingest


def test_the_stored_provenance_names_the_device_the_model_ran_on(tmp_path: Path) -> None:
    stats = [Stat(0, 0, "range_max", 3.5), Stat(0, None, "pearson_range_v_error_4bit", 0.25)]
    analysis = Analysis("tiny-qwen3", "fidelity", 1, 64, {"limit": 1}, stats, device="cuda:0")
    write_table(analysis, tmp_path)
    ingest(tmp_path)
    con = duckdb.connect(str(tmp_path / "kvbench.duckdb"), read_only=True)
    try:
        stored = con.execute("SELECT DISTINCT provenance FROM value_analysis").fetchall()
    finally:
        con.close()
    (provenance,) = [json.loads(text) for (text,) in stored]
    assert provenance["hardware"]["device"] == "cuda:0"
