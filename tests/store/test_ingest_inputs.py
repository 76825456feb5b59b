"""`kvbench ingest` on what it finds beside the shards: benchmark records (runs/bench/*.json) and value
analyses (runs/analysis/values-*.parquet). A file that does not read is named with what to do; no file
name, and no folder name, ever becomes SQL."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from invoke import kvbench


def tables(database: Path) -> set[str]:
    with duckdb.connect(str(database), read_only=True) as con:
        return {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}


def analysis(path: Path, analysis_id: str) -> Path:
    """A value-analysis table as `kvbench analyze values` writes it (the columns ingest reads whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = {"analysis_id": [analysis_id], "layer": [0], "head": [None], "statistic": ["x"], "value": [1.0]}
    pq.write_table(pa.table(rows), path)
    return path


def test_a_malformed_benchmark_record_is_named_with_what_to_do(tmp_path: Path) -> None:
    bench = tmp_path / "runs" / "bench"
    bench.mkdir(parents=True)
    (bench / "decode-broken.json").write_text('{"settings": {"model": "tiny-qwen3"}, "results": [')
    (bench / "decode-old.json").write_text(
        json.dumps({"created": 1.0, "settings": {}, "results": [{"policy": "x"}]})
    )
    done = kvbench("ingest", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr
    assert "Traceback" not in err
    assert "2 benchmark record(s) under runs/bench" in err and "nothing was ingested" in err
    assert "runs/bench/decode-broken.json: JSONDecodeError" in err
    assert "runs/bench/decode-old.json: KeyError: 'tokens'" in err
    assert "Move each away (or delete it) and run `kvbench ingest --out runs` again" in err
    (bench / "decode-broken.json").unlink()
    (bench / "decode-old.json").unlink()
    assert kvbench("ingest", cwd=tmp_path).returncode == 0  # what it said to do works


def test_a_crafted_analysis_file_name_creates_no_table(tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "analysis"
    analysis(folder / "values-a.parquet", "a")
    crafted = "values-a.parquet'], union_by_name=true); CREATE TABLE pwned AS SELECT 42 AS x; --.parquet"
    analysis(folder / crafted, "crafted")
    done = kvbench("ingest", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    database = tmp_path / "runs" / "kvbench.duckdb"
    assert "pwned" not in tables(database)
    with duckdb.connect(str(database), read_only=True) as con:  # the crafted file is read as a file
        ids = sorted(r[0] for r in con.execute("SELECT analysis_id FROM value_analysis").fetchall())
    assert ids == ["a", "crafted"]


def test_an_apostrophe_in_the_results_folder_is_only_a_name(tmp_path: Path) -> None:
    out = tmp_path / "Jane's runs"
    analysis(out / "analysis" / "values-b.parquet", "b")
    done = kvbench("ingest", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"into {out / 'kvbench.duckdb'}" in done.stdout
    with duckdb.connect(str(out / "kvbench.duckdb"), read_only=True) as con:
        assert con.execute("SELECT analysis_id FROM value_analysis").fetchall() == [("b",)]
