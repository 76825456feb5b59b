"""Public mode: nothing on the page names this machine, private tasks stay ids and verdicts, tables are
bounded, and the About page states the protocol, the statistics and how to submit."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from boardtest import all_text, frame, open_app

from kvbench.bench.leaderboard import synthetic_store
from kvbench.leaderboard.public import ROW_CAP, public_mode, scrubbed
from kvbench.leaderboard.queries import Compression

HUB = Path(__file__).resolve().parents[1] / "fixtures" / "hub"


def _every_view(app) -> list[str]:
    """The page's text over the views a visitor can reach: every tab at 2x and at K = 384 (the private
    GPQA run's table), the private run's drill-down and its head-to-head included."""
    shown = list(all_text(app))
    app.sidebar.selectbox(key="compression").set_value(Compression(None, 384)).run()
    app.selectbox(key="policy").set_value("snapkv").run()
    private = next(o for o in app.selectbox(key="drill").options if "/ gpqa-diamond /" in o)
    app.selectbox(key="drill").set_value(private).run()
    assert not app.exception
    return shown + list(all_text(app))


def test_the_public_page_names_no_path_host_or_private_text(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch, public=True)
    assert not any("database:" in c.value for c in app.sidebar.caption)
    assert any("Published snapshot" in c.value for c in app.sidebar.caption)
    shown = _every_view(app)
    text = "\n".join(shown)
    assert "gpqa-diamond" in text and "gsm8k" in text  # the private task is listed, by id
    host = socket.gethostname()
    secrets = [str(board_db.parents[1]), str(HUB), "Linux-", "PRIVATE-", *([host] if len(host) > 2 else [])]
    for secret in secrets:
        assert secret not in text, secret
    assert not any(s.startswith("/") for s in shown)
    drill = frame(app, "Policy", 1)
    assert "output" not in drill.columns and len(drill) == 2
    # the local page does name its database: the check above is not vacuous
    local = open_app(board_db, monkeypatch)
    assert any(str(board_db) in c.value for c in local.sidebar.caption)


def test_an_empty_public_page_names_no_path(tmp_path: Path, monkeypatch) -> None:
    app = open_app(tmp_path / "nothing.duckdb", monkeypatch, public=True)
    assert "No results have been published" in app.info[0].value
    assert str(tmp_path) not in "\n".join(all_text(app))


def test_an_empty_local_page_names_the_database_it_read_and_keeps_the_about_text(
    tmp_path: Path, monkeypatch
) -> None:
    database = tmp_path / "elsewhere" / "board.snapshot.duckdb"  # as `kvbench leaderboard --db` names it
    app = open_app(database, monkeypatch)
    assert not app.exception
    assert app.info[0].value == f"No results in {database} yet."
    (how,) = [m.value for m in app.markdown if "Produce some" in m.value]
    assert how.endswith(f"this page reads `{database}`.")
    (about,) = app.expander
    assert about.label == "About kvbench and this leaderboard"
    assert any("Random Attention" in m.value and "kvbench export" in m.value for m in about.markdown)


def test_a_drill_down_is_capped_and_says_so(tmp_path: Path, monkeypatch) -> None:
    database = tmp_path / "store.duckdb"
    synthetic_store(database, policies=1, tasks=1, problems=1_300, samples=4)  # 5,200 rows per run
    app = open_app(database, monkeypatch, public=True)
    rows = frame(app, "Policy", 1)
    assert len(rows) == ROW_CAP
    assert any(f"The first {ROW_CAP:,} of 5,200 sample rows" in c.value for c in app.caption)


def test_the_about_page_explains_protocol_statistics_and_submission(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch, public=True)
    (about,) = [t for t in app.tabs if t.label == "About"]
    text = "\n".join(m.value for m in about.markdown)
    for needed in (
        "Budget K", "Buffer B", "protect-prompt", "protocol seed", "Random Attention", "uniformly random",
        "bootstrap", "10,000", "sign test", "Holm", "α = 0.05", "beats null", "kvbench export",
        "kvbench accept BUNDLE --db PATH", "kvbench verify DIGEST --db PATH", "kvbench withdraw",
    ):  # fmt: skip
        assert needed in text, needed


@pytest.mark.parametrize("value,public", [("1", True), ("true", True), ("", False), ("0", False)])
def test_public_mode_is_read_from_the_environment(value: str, public: bool) -> None:
    assert public_mode({"KVBENCH_LEADERBOARD_PUBLIC": value}) is public


def test_scrubbing_removes_paths_and_the_host_name_only(monkeypatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "board-host-7")
    assert scrubbed("read /home/me/data.jsonl on board-host-7") == "read … on …"
    assert scrubbed(r"C:\Users\me\x.json and ~/runs/a") == "… and …"
    for kept in ("tiny-qwen3/gsm8k/snapkv@K=384", "K = N_avg/4", "hf/cpu/float32/sdpa"):
        assert scrubbed(kept) == kept
