"""The head-to-head view: two arms of a table paired per task and pooled. The expected numbers are
computed here from SQL, with scipy's sign test and a bootstrap written out in numpy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from boardtest import by_policy, chart_traces, frame, open_app, sql_scores
from bootstrap_by_hand import bootstrap_interval
from exact_by_hand import tail
from scipy.stats import binomtest

from kvbench.leaderboard.queries import Compression


def exact_interval_holds(wins: int, losses: int, n: int, low: float, high: float) -> bool:
    """An exact interval's ends (shown to 3 decimals) are where each one-sided exact test, enumerated,
    crosses 2.5%: not rejected just inside, rejected just outside."""

    def crosses(end: float, upper: bool) -> bool:
        inward = -2e-3 if not upper else 2e-3
        inside = tail(wins, losses, n, end + inward, upper, 201) >= 0.025
        return inside and tail(wins, losses, n, end - inward, upper, 201) <= 0.025

    return (low <= -0.999 or crosses(low, True)) and (high >= 0.999 or crosses(high, False))


def expected_row(a: dict[str, float], b: dict[str, float]) -> dict:
    shared = sorted(set(a) & set(b))
    deltas = [a[p] - b[p] for p in shared]
    wins, losses = sum(d > 0 for d in deltas), sum(d < 0 for d in deltas)
    p = binomtest(wins, wins + losses).pvalue if wins + losses else 1.0
    binary = all(v in (0.0, 1.0) for v in (*a.values(), *b.values()))
    return {
        "delta": sum(deltas) / len(deltas),
        "ci": None if binary else bootstrap_interval(deltas),
        "exact": (wins, losses, len(deltas)) if binary else None,
        "wtl": (wins, len(deltas) - wins - losses, losses),
        "p": p,
    }


def check(row: dict, want: dict) -> None:
    assert row["Δ (A − B)"] == pytest.approx(want["delta"])
    low, high = (float(x) for x in row["95% CI"].strip("[]").split(", "))
    if want["exact"] is None:
        assert (low, high) == pytest.approx(want["ci"], abs=5e-4)
    else:  # one pass/fail sample per problem: the exact interval, checked at its ends
        assert exact_interval_holds(*want["exact"], low, high)
    assert tuple(int(x) for x in row["W/T/L"].split("/")) == want["wtl"]
    assert row["p (sign test)"] == pytest.approx(want["p"])


def test_per_task_and_pooled_differences_match_sql(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch, url={"pair_a": "snapkv", "pair_b": "random (null)"})
    rows = {r["task"]: r for r in frame(app, "Head-to-head").to_dict("records")}
    scores = sql_scores(board_db, 2.0)
    snap, null = scores["snapkv"], scores["random"]
    assert set(rows) == {"fidelity", "passkey"}  # two kinds of metric: no pooled row
    for task in ("fidelity", "passkey"):
        check(rows[task], expected_row(snap[task], null[task]))
    # Holm across the two tasks: the smaller p doubled, the larger at least that
    ps = sorted(rows[t]["p (sign test)"] for t in ("fidelity", "passkey"))
    holm = sorted(rows[t]["p (Holm, tasks)"] for t in ("fidelity", "passkey"))
    assert holm == pytest.approx([min(1.0, 2 * ps[0]), min(1.0, max(2 * ps[0], ps[1]))])
    # gsm8k and gpqa-diamond are both pass/fail: pooled, as the leaderboard's pooled Δ vs null and W/T/L
    app = open_app(
        board_db, monkeypatch, url={"compression": "K384", "pair_a": "snapkv", "pair_b": "random (null)"}
    )
    rows = {r["task"]: r for r in frame(app, "Head-to-head").to_dict("records")}
    scores = sql_scores(board_db, None, 384)
    graded = ("gsm8k", "gpqa-diamond")
    pooled = {(t, p): v for t in graded for p, v in scores["snapkv"][t].items()}
    pooled_null = {(t, p): v for t in graded for p, v in scores["random"][t].items()}
    check(rows["pooled (2 tasks)"], expected_row(pooled, pooled_null))
    table = {r["policy"]: r for r in frame(app, "Leaderboard").to_dict("records")}
    assert rows["pooled (2 tasks)"]["Δ (A − B)"] == pytest.approx(table["snapkv"]["Δ vs null"])
    assert rows["pooled (2 tasks)"]["W/T/L"] == table["snapkv"]["W/T/L"]


def test_the_per_problem_table_has_both_scores_and_the_outcome(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch, url={"pair_a": "streaming", "pair_b": "full (full cache)"})
    problems = frame(app, "Head-to-head", 1)
    scores = sql_scores(board_db, 2.0)
    assert len(problems) == sum(len(scores["streaming"][t]) for t in ("fidelity", "passkey"))
    for row in problems.to_dict("records"):
        one = scores["streaming"][row["task"]][row["problem_id"]]
        two = scores["full"][row["task"]][row["problem_id"]]
        assert (row["A"], row["B"]) == pytest.approx((one, two))
        assert row["outcome"] == ("A higher" if one > two else "B higher" if one < two else "tie")


def test_the_chart_draws_each_task_and_the_pool_with_its_interval(board_db: Path, monkeypatch) -> None:
    url = {"compression": "K384", "pair_a": "snapkv", "pair_b": "random (null)"}
    app = open_app(board_db, monkeypatch, url=url)
    rows = frame(app, "Head-to-head").set_index("task")
    traces = chart_traces(app, "Head-to-head")
    assert set(traces) == {"per task", "pooled"}
    per_task = dict(zip(traces["per task"]["y"], traces["per task"]["x"], strict=True))
    assert per_task == pytest.approx(rows.loc[["gpqa-diamond", "gsm8k"], "Δ (A − B)"].to_dict())
    (pooled_x,) = traces["pooled"]["x"]
    (upper,) = traces["pooled"]["error_x"]["array"]
    low, high = (float(x) for x in rows.loc["pooled (2 tasks)", "95% CI"].strip("[]").split(", "))
    assert pooled_x + upper == pytest.approx(high, abs=5e-4) and pooled_x > low - 1e-9


def test_a_private_task_is_paired_by_id_only(board_db: Path, monkeypatch) -> None:
    app = open_app(
        board_db, monkeypatch, url={"compression": "K384", "pair_a": "snapkv", "pair_b": "full (full cache)"}
    )
    assert app.sidebar.selectbox(key="compression").value == Compression(None, 384)
    problems = frame(app, "Head-to-head", 1)
    assert set(problems["task"]) == {"gsm8k", "gpqa-diamond"}
    assert list(problems.columns) == ["task", "problem_id", "A", "B", "outcome"]
    shown = json.dumps(problems.astype(str).to_numpy().tolist())
    assert "PRIVATE-" not in shown


def test_the_same_arm_twice_asks_for_another(board_db: Path, monkeypatch) -> None:
    app = open_app(board_db, monkeypatch, url={"pair_a": "snapkv", "pair_b": "snapkv"})
    assert any("two different arms" in i.value for i in app.info)


def test_a_pair_the_page_chose_follows_the_filter_and_one_the_visitor_chose_stays(
    board_db: Path, monkeypatch
) -> None:
    app = open_app(board_db, monkeypatch)
    pair = lambda: (app.selectbox(key="pair_a").value, app.selectbox(key="pair_b").value)  # noqa: E731
    first = next(p for p, row in by_policy(app).items() if row["role"] == "policy")  # the table's order
    assert pair() == (first, "random (null)")  # the first policy against the null
    app.sidebar.text_input(key="name").set_value("no such policy").run()
    assert pair() == ("full (full cache)", "random (null)")  # only the baselines are left
    app.sidebar.text_input(key="name").set_value("").run()
    assert pair() == (first, "random (null)")  # the policy comes back with the filter cleared
    app.selectbox(key="pair_a").set_value("full (full cache)").run()  # the visitor's own choice
    app.sidebar.text_input(key="name").set_value("snap").run()
    app.sidebar.text_input(key="name").set_value("").run()
    assert not app.exception
    assert pair() == ("full (full cache)", "random (null)")
