"""One store read through the three places that show a comparison — `kvbench run`'s table, `kvbench
compare` and the leaderboard — gives the same numbers: they format one builder's results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from invoke import kvbench

from kvbench.leaderboard import queries
from kvbench.leaderboard.queries import Compression
from kvbench.results.compare import Filters, compare

POLICIES = ("snapkv", "h2o", "streaming")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("three-paths")
    args = [
        "run",
        "--model",
        "tiny-qwen3",
        "--task",
        "fidelity",
        "--limit",
        "4",
        "--quiet",
        "--json",
        "t.json",
    ]
    for policy in POLICIES:
        args += ["--policy", policy]
    done = kvbench(*args, cwd=root)
    assert done.returncode == 0, done.stderr
    return root / "runs", json.loads((root / "t.json").read_text())


def test_run_table_compare_and_leaderboard_agree(store: tuple[Path, dict]) -> None:
    runs, table = store
    from_run = {r["policy"]: r for r in table["rows"]}
    from_compare = {r["policy"]: r for r in compare(runs / "kvbench.snapshot.duckdb", Filters())}
    frame = queries.leaderboard(
        runs / "kvbench.snapshot.duckdb", "tiny-qwen3", "protect-prompt", Compression(4.0, None)
    ).frame
    from_board = frame.set_index("policy").to_dict("index")
    assert set(from_compare) == set(POLICIES) and set(from_board) == {*POLICIES, "random", "full"}
    for policy in POLICIES:
        run, cmp, board = from_run[policy], from_compare[policy], from_board[policy]
        test = run["null_test"]
        assert (cmp["score"], cmp["score_low"], cmp["score_high"]) == (
            run["score"]["value"],
            run["score"]["low"],
            run["score"]["high"],
        )
        assert board["average"] == cmp["score"]
        assert (
            board["average ± CI"] == f"{cmp['score']:.3f} ± {(cmp['score_high'] - cmp['score_low']) / 2:.3f}"
        )
        assert (cmp["delta"], cmp["delta_low"], cmp["delta_high"]) == (
            run["vs_null"]["value"],
            run["vs_null"]["low"],
            run["vs_null"]["high"],
        )
        assert board["Δ vs null"] == cmp["delta"]
        assert (cmp["wins"], cmp["ties"], cmp["losses"]) == (test["wins"], test["ties"], test["losses"])
        assert board["W/T/L"] == f"{cmp['wins']}/{cmp['ties']}/{cmp['losses']}"
        assert cmp["p_holm"] == test["p_adjusted"] == board["p (Holm)"]
        assert cmp["verdict"] == test["verdict"]
        assert board["verdict"] == queries.BADGES[cmp["verdict"]]
        assert cmp["delta_full"] == run["vs_full"]["value"] == board["Δ vs full"]
        assert cmp["k_over_n_avg"] == run["k_over_n_avg"] == board["K/N_avg"]
        assert not math.isnan(cmp["delta_full"]) and cmp["problems"] == run["problems"] == 4
    # the family of the Holm correction is the three policies in every path: p(Holm) is not the raw p
    raw = [from_run[p]["null_test"]["p_value"] for p in POLICIES]
    assert sorted(from_compare[p]["p_holm"] for p in POLICIES)[0] == min(1.0, 3 * min(raw))
