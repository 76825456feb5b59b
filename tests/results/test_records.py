"""The stored records: one typed source for the shards' schema and the database's tables, and a store of
the previous schema (written by kvbench before this change, tests/fixtures/store-v4) rebuilt from its shards
with every value kept."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pydantic
import pytest
from invoke import kvbench

from kvbench.results.check import outputs_digest
from kvbench.store import records
from kvbench.store.ingest import SCHEMA
from kvbench.store.records import INT32, RunRecord, SampleRecord, arrow_schema, table_ddl
from kvbench.store.shards import ADDED_IN_6, ADDED_IN_8, ADDED_IN_9, upgrade

V4 = Path(__file__).resolve().parents[1] / "fixtures" / "store-v4"


def database_columns(con: duckdb.DuckDBPyConnection, table: str) -> dict[str, str]:
    rows = con.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? "
        "ORDER BY ordinal_position",
        [table],
    ).fetchall()
    return dict(rows)


def test_the_arrow_schema_and_the_tables_are_the_record_models() -> None:
    con = duckdb.connect()
    con.execute(SCHEMA)
    for model, table in ((SampleRecord, "samples"), (RunRecord, "runs")):
        assert list(database_columns(con, table)) == list(model.model_fields)
        assert arrow_schema(model).names == list(model.model_fields)
    assert records.SAMPLE_SCHEMA.field("sample").type == pa.int32()
    assert database_columns(con, "samples")["secondary"] == "JSON"


def test_a_new_field_appears_in_the_arrow_schema_and_the_ddl() -> None:
    from typing import Annotated

    class Grown(SampleRecord):
        prefill_tokens: Annotated[int, INT32] | None = None
        """A field a later issue might add."""

    con = duckdb.connect()
    con.execute(table_ddl(Grown, "grown", records.SAMPLE_KEY))
    assert database_columns(con, "grown")["prefill_tokens"] == "INTEGER"
    assert arrow_schema(Grown).field("prefill_tokens").type == pa.int32()


def test_a_record_refuses_a_misspelt_field() -> None:
    with pytest.raises(pydantic.ValidationError, match="grader_verison"):
        SampleRecord(
            run_id="r", task="t", problem_id="p", problem_hash="h", sample=0, seed=0, metric=1.0,
            correct=True, strict_correct=True, finish_reason="stop", generated_tokens=1, evictions=0,
            eviction_seconds=0.0, output=None, wall_seconds=0.0, grader_verison="math-1",
        )  # fmt: skip


def test_a_schema_5_shard_keeps_its_columns_and_reads_no_survival() -> None:
    record = SampleRecord(
        run_id="r", task="passkey", problem_id="p", problem_hash="h", sample=0, seed=3, metric=0.0,
        correct=False, strict_correct=False, finish_reason="teacher-forced", generated_tokens=9, evictions=2,
        eviction_seconds=0.5, output=None, wall_seconds=1.0, answer_logprob=-12.5, no_answer=True,
        grader_version="math-1", needle_survival=0.25, needle_whole_layers=0.5,
        needle_survival_by_head=[0.0, 0.5, 0.25, 0.25], needle_high_precision=0.75, kv_budget_tokens=704,
        kv_budget_bytes=126976, kv_peak_bytes=150000, prompt_held_any=[1.0, 0.5], prompt_held_all=[0.5, 0.25],
        head_coverage=[0.5, 0.75], kept_by_age=[0.0] * 9 + [1.0], needle_events=3,
    )  # fmt: skip
    table = pa.Table.from_pylist([record.row()], schema=records.SAMPLE_SCHEMA)
    assert upgrade(table).to_pylist() == [record.row()]  # the current schema reads back unchanged
    v5 = table.drop_columns([*ADDED_IN_6, *ADDED_IN_8, *ADDED_IN_9])
    (row,) = upgrade(v5).to_pylist()
    # measured columns kept, survival, budget bytes and retention unknown
    assert row == record.row() | dict.fromkeys([*ADDED_IN_6, *ADDED_IN_8, *ADDED_IN_9])
    v7 = table.drop_columns([*ADDED_IN_8, *ADDED_IN_9])
    (row,) = upgrade(v7).to_pylist()
    assert row == record.row() | dict.fromkeys([*ADDED_IN_8, *ADDED_IN_9])
    v8 = table.drop_columns(list(ADDED_IN_9))
    (row,) = upgrade(v8).to_pylist()
    assert row == record.row() | dict.fromkeys(ADDED_IN_9)


def old_values(database: Path) -> list[tuple[Any, ...]]:
    """Every v4 sample's values, its measurements read out of `secondary` as v4 stored them."""
    con = duckdb.connect(str(database), read_only=True)
    rows = con.execute(
        "SELECT run_id, problem_id, sample, seed, metric, correct, strict_correct, finish_reason, "
        "generated_tokens, evictions, output, secondary FROM samples ORDER BY run_id, problem_id, sample"
    ).fetchall()
    con.close()
    out = []
    for *head, secondary in rows:
        extra = json.loads(secondary)
        measured = tuple(extra.pop(k, None) for k in ("no_answer", "grader", "answer_logprob", "kl_to_full"))
        extra.pop("eviction_seconds")
        out.append((*head, *measured, extra))
    return out


def new_values(database: Path) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(database), read_only=True)
    rows = con.execute(
        "SELECT run_id, problem_id, sample, seed, metric, correct, strict_correct, finish_reason, "
        "generated_tokens, evictions, output, no_answer, grader_version, answer_logprob, kl_to_full, "
        "secondary FROM samples ORDER BY run_id, problem_id, sample"
    ).fetchall()
    con.close()
    return [(*head, json.loads(secondary)) for *head, secondary in rows]


def v4_digest(con: duckdb.DuckDBPyConnection, run_id: str) -> str:
    """The outputs digest as kvbench computed it on schema 4, every measurement inside `secondary`."""
    digest = hashlib.sha256()
    rows = con.execute(
        "SELECT problem_id, sample, metric, correct, strict_correct, finish_reason, generated_tokens, "
        "evictions, output, secondary FROM samples WHERE run_id = ? ORDER BY problem_id, sample",
        [run_id],
    ).fetchall()
    for row in rows:
        metric = None if row[2] is None else round(row[2], 12)
        values = json.loads(row[-1] or "{}")
        kept = {
            k: round(v, 9) if isinstance(v, float) else v
            for k, v in values.items()
            if not k.endswith("seconds")
        }
        digest.update(repr((*row[:2], metric, *row[3:-1], json.dumps(kept, sort_keys=True))).encode())
    return digest.hexdigest()[:16]


@pytest.mark.slow
def test_an_old_store_is_refused_then_rebuilt_from_its_shards(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(V4 / "shards", runs / "shards")
    with gzip.open(V4 / "kvbench.duckdb.gz") as packed, open(runs / "kvbench.duckdb", "wb") as database:
        shutil.copyfileobj(packed, database)
    shutil.copyfile(runs / "kvbench.duckdb", tmp_path / "v4.duckdb")
    expected = old_values(runs / "kvbench.duckdb")
    assert len(expected) == 24 and any(row[11] is not None for row in expected)  # generated rows too

    refused = kvbench("ingest", cwd=tmp_path)
    assert refused.returncode != 0
    assert f"schema 4, this kvbench writes {records.SCHEMA_VERSION}" in refused.stderr
    assert "kvbench ingest --rebuild --out runs" in refused.stderr
    assert old_values(runs / "kvbench.duckdb") == expected  # the refused database is left as it was

    rebuilt = kvbench("ingest", "--rebuild", cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert new_values(runs / "kvbench.duckdb") == expected
    con = duckdb.connect(str(runs / "kvbench.duckdb"), read_only=True)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
        str(records.SCHEMA_VERSION),
    )
    assert con.execute("SELECT count(*) FROM runs").fetchone() == (9,)
    assert con.execute("SELECT count(*) FROM runs WHERE policy_doc IS NULL").fetchone() == (9,)
    con.close()
    # `kvbench check` digests the rebuilt rows exactly as it digested them before the columns existed, so
    # that committed references stay comparable (schema 4's algorithm, written out here on the old file)
    old = duckdb.connect(str(tmp_path / "v4.duckdb"), read_only=True)
    new = duckdb.connect(str(runs / "kvbench.duckdb"), read_only=True)
    run_ids = [r for (r,) in new.execute("SELECT run_id FROM runs ORDER BY 1").fetchall()]
    assert [outputs_digest(new, r) for r in run_ids] == [v4_digest(old, r) for r in run_ids]
    old.close()
    new.close()
    # the rebuilt store reads like a new one: compare pairs its arms
    compared = kvbench("compare", "--format", "json", cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr
    assert {r["policy"] for r in json.loads(compared.stdout)} == {"snapkv"}
