"""Permalinks: the URL's query parameters restore a selection, widgets write it back, and a value that
names nothing falls back to the default."""

from __future__ import annotations

from pathlib import Path

import pytest
from boardtest import by_policy, open_app

from kvbench.leaderboard import permalink
from kvbench.leaderboard.queries import Compression

SELECTION = {
    "model": "tiny-qwen3",
    "runtime": "hf/cpu/float32/sdpa",
    "seed": "0",
    "compression": "4x",
    "name": "snap",
    "quantity": "score",
    "view": "Head-to-head",
    "policy": "snapkv",
    "pair_a": "snapkv",
    "pair_b": "full (full cache)",
}


def test_a_url_restores_the_selection(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch, url=SELECTION)
    assert app.sidebar.selectbox(key="compression").value == Compression(4.0, None)
    assert app.sidebar.text_input(key="name").value == "snap"
    assert app.session_state["view"] == "Head-to-head"
    assert app.selectbox(key="policy").value == "snapkv"
    assert (app.selectbox(key="pair_a").value, app.selectbox(key="pair_b").value) == (
        "snapkv",
        "full (full cache)",
    )
    rows = by_policy(app)
    assert set(rows) == {"snapkv", "random", "full"} and rows["snapkv"]["K/N_avg"] == pytest.approx(0.25)
    assert {k: app.query_params[k] for k in SELECTION} == SELECTION  # the URL keeps what it asked for


def test_a_fixed_budget_has_its_own_code(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch, url={"compression": "K384"})
    assert app.sidebar.selectbox(key="compression").value == Compression(None, 384)
    assert "gsm8k" in by_policy(app)["snapkv"]


def test_changing_a_widget_updates_the_url(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch)
    assert app.query_params["compression"] == "2x" and app.query_params["view"] == "Leaderboard"
    app.sidebar.selectbox(key="compression").set_value(Compression(4.0, None)).run()
    app.sidebar.text_input(key="name").set_value("stream").run()
    app.selectbox(key="pair_b").set_value("full (full cache)").run()
    assert app.query_params["compression"] == "4x" and app.query_params["name"] == "stream"
    assert app.query_params["pair_a"] == "streaming" and app.query_params["pair_b"] == "full (full cache)"
    app.sidebar.text_input(key="name").set_value("").run()
    assert "name" not in app.query_params


def test_values_that_name_nothing_fall_back_to_the_defaults(board_db: Path, monkeypatch) -> None:
    nonsense = {
        "model": "nope", "protocol": "'; DROP TABLE runs; --", "seed": "abc", "compression": "99x",
        "quantity": "bogus", "view": "Nope", "policy": "zzz", "pair_a": "zzz", "pair_b": "",
    }  # fmt: skip
    app = open_app(board_db, monkeypatch, url=nonsense)
    assert app.sidebar.selectbox(key="model").value == "tiny-qwen3"
    assert app.sidebar.selectbox(key="compression").value == Compression(2.0, None)
    assert app.sidebar.selectbox(key="quantity").value == "score"
    assert app.session_state["view"] == "Leaderboard"
    assert app.selectbox(key="pair_b").value == "random (null)"
    assert app.query_params["compression"] == "2x" and app.query_params["model"] == "tiny-qwen3"
    assert set(by_policy(app)) == {"full", "random", "streaming", "snapkv"}


def test_the_url_is_read_once_per_widget_and_session() -> None:
    state: dict = {}
    params = {"compression": "4x"}
    options = [Compression(2.0, None), Compression(4.0, None)]
    permalink.from_url("compression", options, permalink.compression_code, params=params, state=state)
    assert state["compression"] == Compression(4.0, None)
    state["compression"] = options[0]  # the visitor picks another: the URL does not take it back
    permalink.from_url("compression", options, permalink.compression_code, params=params, state=state)
    assert state["compression"] == options[0]
    permalink.from_url("name", params={"name": "h2o"}, state=state)
    assert state["name"] == "h2o"
