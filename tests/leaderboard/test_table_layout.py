"""The main table as a first user sees it: the verdict beside the policy, the rest behind "all columns",
memory columns only where they say something, arms on fewer problems than the null marked, and one
compression ratio drawn as points rather than an invisible curve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from boardtest import by_policy, chart_traces, open_app, tab

# what the table opens with: the verdict pinned beside the policy, so that a narrow screen still shows it
COMPACT = [
    "policy", "verdict", "average ± CI", "Δ vs null", "p (Holm)", "fidelity", "K/N_avg", "problems × samples",
]  # fmt: skip


def _main_table(app):
    (grid,) = tab(app, "Leaderboard").dataframe
    return grid


def test_the_table_opens_compact_with_the_verdict_pinned_beside_the_policy(
    one_ratio_db: Path, monkeypatch
) -> None:
    app = open_app(one_ratio_db, monkeypatch)
    grid = _main_table(app)
    assert list(grid.proto.column_order) == COMPACT
    config = json.loads(grid.proto.columns)
    assert config["policy"]["pinned"] is True and config["verdict"]["pinned"] is True
    app.toggle(key="wide").set_value(True).run()
    wide = list(_main_table(app).proto.column_order)
    assert wide[: len(COMPACT)] == COMPACT
    assert {"margin", "MDE", "W/T/L", "Δ vs full", "parameters", "verified"} <= set(wide)
    # eviction alone: every arm held K tokens at one byte cost, so the memory columns say nothing
    assert not {"K held/N_avg", "bytes/token", "byte budget (MiB)"} & set(wide)


def test_an_arm_on_fewer_problems_than_the_null_is_marked(one_ratio_db: Path, monkeypatch) -> None:
    app = open_app(one_ratio_db, monkeypatch)
    table = by_policy(app)
    assert table["h2o"]["problems × samples"] == "1 × 1 ≠ null"
    assert table["snapkv"]["problems × samples"] == "2 × 1"
    assert table["random"]["problems × samples"] == "2 × 1"
    assert table["h2o"]["fidelity"].endswith(" (1 problem)") and "±" not in table["h2o"]["fidelity"]
    assert " ± " in table["snapkv"]["fidelity"]
    (warning,) = [w.value for w in tab(app, "Leaderboard").warning]
    assert warning == (
        "Marked ≠ null: h2o scored 1 problems, the null 2, both 1. Their cells average their own problems, "
        "while Δ vs null, W/T/L and the verdicts pair the problems both ran."
    )
    assert (
        table["h2o"]["W/T/L"].count("/") == 2 and sum(int(x) for x in table["h2o"]["W/T/L"].split("/")) == 1
    )


def test_one_ratio_is_drawn_as_points_with_the_null_band_and_the_full_cache(
    one_ratio_db: Path, monkeypatch
) -> None:
    app = open_app(one_ratio_db, monkeypatch, url={"view": "Budget curves"})
    view = tab(app, "Budget curves")
    assert any("one compression ratio" in i.value and "--suite probes" in i.value for i in view.info)
    traces = chart_traces(app, "Budget curves")
    (points,) = traces.values()
    assert points["mode"] == "markers" and set(points["x"]) == {"h2o", "snapkv", "random"}
    (chart,) = view.get("plotly_chart")
    layout = json.loads(chart.proto.spec)["layout"]
    shapes = {s.get("name"): s for s in layout["shapes"]}
    null = by_policy(app)["random"]
    assert shapes["full cache"]["y0"] == shapes["full cache"]["y1"] == by_policy(app)["full"]["average"]
    band = shapes["Random Attention (null) 95% CI"]
    half_width = float(null["average ± CI"].split(" ± ")[1])
    assert band["y0"] < null["average"] < band["y1"]
    assert (band["y1"] - band["y0"]) / 2 == pytest.approx(half_width, abs=5e-4)
