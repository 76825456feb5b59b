"""Deployment: the publishable copy of a snapshot, and the Space's entry point serving one beside it in
public mode."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pandas as pd
from boardtest import all_text, by_policy
from streamlit.testing.v1 import AppTest

from kvbench.leaderboard import queries
from kvbench.leaderboard.app import DATABASE_ENV
from kvbench.leaderboard.public import PUBLIC_ENV
from kvbench.leaderboard.publish import main as publish
from kvbench.leaderboard.queries import Compression

ROOT = Path(__file__).resolve().parents[2]
SPACE = ROOT / "deploy" / "space"
HUB = str(Path(__file__).resolve().parents[1] / "fixtures" / "hub")


def locked_versions() -> dict[str, str]:
    """Package -> version, as requirements/lock.txt pins them."""
    lines = (ROOT / "requirements" / "lock.txt").read_text().splitlines()
    return dict(line.split("==", 1) for line in lines if "==" in line and not line.startswith("#"))


def test_the_published_copy_keeps_the_numbers_and_drops_paths(board_db: Path, tmp_path: Path) -> None:
    target = tmp_path / "public.duckdb"
    assert publish([str(board_db), str(target)]) == 0
    with duckdb.connect(str(board_db), read_only=True) as con:
        (before,) = con.execute(
            "SELECT count(*) FROM runs WHERE contains(spec::VARCHAR, ?)", [HUB]
        ).fetchone()
    assert before > 0  # the runs made with --data record the fixture's folder
    with duckdb.connect(str(target), read_only=True) as con:
        (after,) = con.execute("SELECT count(*) FROM runs WHERE contains(spec::VARCHAR, ?)", [HUB]).fetchone()
        platforms = con.execute(
            "SELECT count(*) FROM runs WHERE hardware->>'platform' IS NOT NULL"
        ).fetchone()
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert after == 0 and platforms == (0,) and "ingested_files" not in tables
    assert HUB.encode() not in target.read_bytes()
    for compression in (Compression(2.0, None), Compression(None, 384)):
        one, other = (
            queries.leaderboard(db, "tiny-qwen3", "protect-prompt", compression) for db in (board_db, target)
        )
        pd.testing.assert_frame_equal(one.frame, other.frame)


def test_the_space_entry_serves_the_snapshot_beside_it_in_public_mode(
    board_db: Path, tmp_path: Path, monkeypatch
) -> None:
    space = tmp_path / "space"
    shutil.copytree(SPACE, space)
    assert publish([str(board_db), str(space / "data" / "kvbench.snapshot.duckdb")]) == 0
    monkeypatch.delenv(DATABASE_ENV, raising=False)
    monkeypatch.delenv(PUBLIC_ENV, raising=False)
    app = AppTest.from_file(str(space / "app.py"), default_timeout=120).run()
    assert not app.exception, app.exception
    assert set(by_policy(app)) == {"full", "random", "streaming", "snapkv"}
    assert any("Published snapshot" in c.value for c in app.sidebar.caption)
    assert str(tmp_path) not in "\n".join(all_text(app))


def test_the_space_header_pins_the_locked_streamlit() -> None:
    header = (SPACE / "README.md").read_text().split("---")[1]
    fields = dict(line.split(": ", 1) for line in header.strip().splitlines())
    locked = locked_versions()["streamlit"]
    assert fields["sdk"] == "streamlit" and fields["app_file"] == "app.py" and fields["sdk_version"] == locked
    required = {
        line.split("==")[0]: line.split("==")[1]
        for line in (SPACE / "requirements.txt").read_text().splitlines()
        if "==" in line
    }
    lock = locked_versions()
    assert required and all(lock[name] == version for name, version in required.items())
    assert "torch" not in required and "kvbench" not in required


def test_the_container_runs_public_as_a_user_with_a_health_check() -> None:
    dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    lines = [line.strip() for line in dockerfile.splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert any(line.startswith("HEALTHCHECK") for line in lines) and "/_stcore/health" in dockerfile
    assert "KVBENCH_LEADERBOARD_PUBLIC=1" in dockerfile and "--no-deps" in dockerfile
    locked = locked_versions()
    assert f"streamlit=={locked['streamlit']}" in dockerfile


def test_a_table_name_is_copied_as_a_name_never_run_as_sql(tmp_path: Path) -> None:
    crafted = 'notes" AS SELECT 42 AS v; CREATE TABLE pwned AS SELECT 1 AS v; --'
    quoted = '"' + crafted.replace('"', '""') + '"'  # how a tool that quotes names writes it
    source = tmp_path / "source.duckdb"
    with duckdb.connect(str(source)) as con:
        con.execute("CREATE TABLE " + quoted + " AS SELECT 7 AS v")
    assert publish([str(source), str(tmp_path / "public.duckdb")]) == 0
    with duckdb.connect(str(tmp_path / "public.duckdb"), read_only=True) as con:
        names = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()]
        assert names == [crafted]  # neither "notes" nor "pwned"
        assert con.execute("SELECT v FROM " + quoted).fetchall() == [(7,)]


def test_the_published_copy_drops_the_platform_of_a_value_analysis(tmp_path: Path) -> None:
    import platform

    from invoke import kvbench

    done = kvbench(
        *("analyze", "values", "--model", "tiny-qwen3", "--task", "fidelity"),
        *("--limit", "1", "--group", "16"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    source, target = tmp_path / "runs" / "kvbench.snapshot.duckdb", tmp_path / "public.duckdb"
    query = "SELECT count(*), count(provenance::JSON->'hardware'->>'platform') FROM value_analysis"
    with duckdb.connect(str(source), read_only=True) as con:
        rows, with_platform = con.execute(query).fetchone()
    assert rows > 0 and with_platform == rows  # the analysis records the machine it ran on
    assert publish([str(source), str(target)]) == 0
    with duckdb.connect(str(target), read_only=True) as con:
        assert con.execute(query).fetchone() == (rows, 0)
        cpu = con.execute("SELECT any_value(provenance::JSON->'hardware'->>'cpu') FROM value_analysis")
        assert cpu.fetchone()[0]  # the CPU model stays, as in a run's hardware
    assert platform.platform().encode() not in target.read_bytes()
