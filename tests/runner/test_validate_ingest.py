"""kvbench validate and kvbench ingest, on real spec files and a real DuckDB file."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest
from invoke import kvbench

import kvbench.tasks as kvbench_tasks
from kvbench.specs.loading import SPEC_ROOT


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


@pytest.mark.parametrize(
    ("kind", "builtin"),
    [
        ("model", SPEC_ROOT / "models" / "smollm2-135m.yaml"),
        ("protocol", SPEC_ROOT / "protocols" / "sink-only.yaml"),
        ("suite", SPEC_ROOT / "suites" / "quick.yaml"),
        ("task", Path(kvbench_tasks.__path__[0]) / "fidelity.yaml"),
    ],
)
def test_validate_reads_a_spec_files_kind_from_its_fields_wherever_it_is(
    tmp_path: Path, kind: str, builtin: Path
) -> None:
    path = tmp_path / "my specs" / "mine.yaml"  # no models/, tasks/, ... folder anywhere above it
    path.parent.mkdir()
    shutil.copy(builtin, path)
    result = kvbench("validate", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"ok\t{kind}\t{builtin.stem}"]


def test_validate_says_how_to_name_the_kind_of_a_file_whose_fields_do_not(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("spec_version: 1\nname: mine\ndescription: d\n")
    result = kvbench("validate", str(path))
    assert result.returncode == 2
    assert f"{path}: cannot tell which kind of spec this is from its fields" in result.stderr
    for fields in ("`family`, `dtype`", "`protection`, `budget`, `sampling`", "`metric`"):
        assert fields in result.stderr
    assert "keep it in a folder named models/, protocols/, suites/, tasks/" in result.stderr
    (tmp_path / "tasks").mkdir()  # where the fields do not tell, the folder does
    result = kvbench("validate", str(path.rename(tmp_path / "tasks" / "mine.yaml")))
    assert result.returncode == 2 and "field `metric`: Field required (add this field)" in result.stderr


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
