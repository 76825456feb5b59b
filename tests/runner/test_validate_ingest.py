"""kvbench validate and kvbench ingest, on real spec files and a real DuckDB file."""

from __future__ import annotations

from pathlib import Path

import duckdb
from invoke import kvbench


def test_validate_every_builtin_spec() -> None:
    result = kvbench("validate")
    assert result.returncode == 0, result.stderr
    checked = {tuple(line.split("\t")[1:]) for line in result.stdout.splitlines()}
    assert {
        ("suite", "quick"),
        ("suite", "probes"),
        ("task", "passkey"),
        ("protocol", "sink-only"),
        ("model", "smollm2-135m"),
    } <= checked


def test_validate_names_the_file_the_field_and_the_fix(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "mine.yaml").write_text(
        "spec_version: 1\nname: mine\ndescription: d\nmetric: exact\n"
        "source: {kind: probe, probe: passkey, problems: 2, length: 100, depht: 10}\n"
    )
    result = kvbench("validate", str(tmp_path))
    assert result.returncode == 2
    assert f"{tasks / 'mine.yaml'}" in result.stderr
    assert (
        "field `source.probe.depht`: Extra inputs are not permitted (remove it or correct its spelling)"
        in (result.stderr)
    )


def test_validate_follows_a_suites_references(tmp_path: Path) -> None:
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "s.yaml").write_text(
        "spec_version: 1\nname: s\ndescription: d\nmodels: [tiny-qwen3]\ntasks: [paskey]\n"
        "policies: [snapkv]\nprotocol: protect-prompt\n"
    )
    result = kvbench("validate", str(suites / "s.yaml"))
    assert result.returncode == 2 and "unknown task 'paskey'. Did you mean 'passkey'" in result.stderr


def test_ingest_is_idempotent_and_rebuilds_from_shards(tmp_path: Path) -> None:
    run = kvbench(
        "run",
        "--model",
        "tiny-qwen3",
        "--quiet",
        "--task",
        "passkey",
        "--policy",
        "streaming",
        "--limit",
        "2",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    database = tmp_path / "runs" / "kvbench.duckdb"

    def counts() -> tuple[int, int]:
        con = duckdb.connect(str(database), read_only=True)
        try:
            return con.execute(
                "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM samples)"
            ).fetchone()
        finally:
            con.close()

    before = counts()
    assert before == (3, 6)
    assert kvbench("ingest", cwd=tmp_path).returncode == 0
    assert counts() == before
    database.unlink()
    (tmp_path / "runs" / "kvbench.snapshot.duckdb").unlink()
    rebuilt = kvbench("ingest", cwd=tmp_path)
    assert "ingested 6 new shard files from 3 runs" in rebuilt.stdout
    assert counts() == before
