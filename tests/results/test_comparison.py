"""One store read through the three places that show a comparison — `kvbench run`'s table, `kvbench
compare` and the leaderboard — gives the same numbers: they format one builder's results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from invoke import kvbench
from scipy.stats import binomtest

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
    assert {from_run[p]["role"] for p in ("random", "full")} == {"null", "reference"}
    for policy in POLICIES:
        run, cmp, board = from_run[policy], from_compare[policy], from_board[policy]
        # run's table is compare's row for the same arm, with its role beside it
        mine = {k: v for k, v in run.items() if k != "role"}
        assert json.dumps(mine, sort_keys=True) == json.dumps(cmp, sort_keys=True)  # NaN equals itself here
        assert run["role"] == "policy"
        assert board["average"] == cmp["score"]
        assert (
            board["average ± CI"] == f"{cmp['score']:.3f} ± {(cmp['score_high'] - cmp['score_low']) / 2:.3f}"
        )
        assert board["Δ vs null"] == cmp["delta"]
        assert board["W/T/L"] == f"{cmp['wins']}/{cmp['ties']}/{cmp['losses']}"
        assert cmp["p_holm"] == board["p (Holm)"]
        assert board["verdict"] == queries.BADGES[cmp["verdict"]]
        assert cmp["delta_full"] == board["Δ vs full"]
        assert cmp["k_over_n_avg"] == board["K/N_avg"]
        assert not math.isnan(cmp["delta_full"]) and cmp["problems"] == 4
    # the family of the Holm correction is the three policies in every path: p(Holm) is not the raw p,
    # which is the two-sided sign test on the wins and losses
    decided = [(r["wins"], r["wins"] + r["losses"]) for r in map(from_compare.get, POLICIES)]
    raw = [binomtest(wins, n).pvalue if n else 1.0 for wins, n in decided]
    assert sorted(from_compare[p]["p_holm"] for p in POLICIES)[0] == pytest.approx(min(1.0, 3 * min(raw)))
