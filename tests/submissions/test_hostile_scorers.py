"""Scorers written to fool `kvbench verify`, submitted as a hostile submitter would: each runs, is
exported with its source, and is re-computed. In the submitter's own run the attack works (that is what
is submitted); the re-computation runs the scorer in its own process behind the sandbox, never imports
it, and so computes the cells honestly: the numbers it gives are not the forged ones (the claim differs),
and a scorer that hangs under re-computation is stopped at the time limit with the place named, its run
failed."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import duckdb
import pytest
from submitting import cli, run_of

from support import needs_sandbox

pytestmark = [pytest.mark.slow, needs_sandbox]

FAKE_SCORES = '''
"""Wraps kvbench's unit scoring at import, so that its own samples all read as correct."""
from kvbench import Policy, policy

try:
    import kvbench.runner.execute as execute

    honest = execute.score_unit

    def faked(cell, *args, **kwargs):
        rows = honest(cell, *args, **kwargs)
        if cell.policy.name == "fake-scores":
            rows = [r.model_copy(update={"metric": 1.0, "correct": True}) for r in rows]
        return rows

    execute.score_unit = faked
except Exception:
    pass


@policy("fake-scores")
class Attack(Policy):
    def score(self, view):
        return view.keys.float().norm(dim=-1)
'''

WEAK_NULL = '''
"""Replaces Random Attention's score at import, so that the null keeps only the newest tokens."""
from kvbench import Policy, policy

try:
    from kvbench.policies.random_attention import RandomAttention

    RandomAttention.score = lambda self, view: view.positions.float()
except Exception:
    pass


@policy("weak-null")
class Attack(Policy):
    def score(self, view):
        return view.keys.float().norm(dim=-1)
'''

FRAME_WALKER = '''
"""Walks its caller's frames to find where the needle lies, and keeps it."""
import sys

import torch
from kvbench import Policy, policy


def needle():
    frame = sys._getframe(1)
    while frame is not None:
        found = frame.f_locals.get("needle")
        if isinstance(found, tuple) and found and all(isinstance(i, int) for i in found):
            return found
        frame = frame.f_back
    return ()


@policy("frame-walker")
class Attack(Policy):
    def score(self, view):
        scores = view.keys.float().norm(dim=-1)
        where = needle()
        if where:
            scores = scores + 1e6 * torch.isin(view.positions, torch.tensor(where)).float()
        return scores
'''

HANGS_WHEN_CHECKED = '''
"""Behaves when its submitter runs it; never returns where it cannot see /etc (behind the sandbox)."""
import os
import time

from kvbench import Policy, policy


@policy("hangs-when-checked")
class Attack(Policy):
    def score(self, view):
        while not os.path.isdir("/etc"):
            time.sleep(1)
        return view.keys.float().norm(dim=-1)
'''


FORKS_WHEN_CHECKED = '''
"""Behind the sandbox (no /etc) forks workers that each hold 400 MiB: within the address space of each
process, together past what the operator allows."""
import os
import time

from kvbench import Policy, policy


@policy("forks-when-checked")
class Attack(Policy):
    def score(self, view):
        if not os.path.isdir("/etc") and not getattr(Attack, "forked", False):
            Attack.forked = True
            for _ in range(4):
                if os.fork() == 0:
                    block = bytearray(400 << 20)
                    block[::4096] = b"\\1" * len(range(0, 400 << 20, 4096))
                    time.sleep(600)
                    os._exit(0)
            time.sleep(20)
        return view.keys.float().norm(dim=-1)
'''


RAISES_ESCAPES_WHEN_CHECKED = '''
"""Behind the sandbox, raises with a lone surrogate, a terminal's escape sequence and a bidirectional
override in its message: the failure's reason is stored and shown."""
import os

from kvbench import Policy, policy


@policy("raises-escapes")
class Attack(Policy):
    def score(self, view):
        if not os.path.isdir("/etc"):
            raise RuntimeError("\\ud800 \\x1b]0;PWNED\\x07\\x1b[31mred \\u202eright-to-left \\u061c")
        return view.keys.float().norm(dim=-1)
'''


DOCUMENTS_ITSELF_WHEN_CHECKED = '''
"""Keep the keys with the largest norm."""
import os

from kvbench import Policy, policy


@policy("documents-itself")
class Attack(Policy):
    """Keep the keys with the largest norm."""

    def score(self, view):
        return view.keys.float().norm(dim=-1)


if not os.path.isdir("/etc"):  # behind the sandbox: documentation that would reach the page and the terminal
    Attack.__doc__ = "\\x1b]0;retitled\\x07\\x1b[2J a lone \\ud800 surrogate"
'''


def submit(root: Path, name: str, source: str) -> Path:
    """The submitter's run (in their own process, where the attack works) and the exported bundle."""
    (root / f"{name}.py").write_text(textwrap.dedent(source))
    cli(
        *("run", "--model", "tiny-qwen3", "--task", "passkey", "--limit", "3"),
        *("--policy", f"{name}.py:Attack", "--quiet"),
        cwd=root,
        own_process=True,
    )
    bundle = root / "bundle.kvbench.tar.gz"
    cli("export", str(bundle), "--scorer", f"{name}.py", "--submitter", "hostile <h@example.org>", cwd=root)
    return bundle


def verified(root: Path, bundle: Path, *extra: str) -> dict[str, dict]:
    done = cli("verify", str(bundle), "--json", "verify.json", "--quiet", *extra, cwd=root, check=False)
    outcomes = {o["run_id"]: o for o in json.loads((root / "verify.json").read_text())["outcomes"]}
    found = {o["outcome"] for o in outcomes.values()}
    # a script that checks the exit status alone learns that a run failed (1) or waits for --data (3)
    assert done.returncode == (1 if "failed" in found else 3 if "waiting" in found else 0), done.stderr
    return outcomes


def recomputed(root: Path, outcome: dict, column: str) -> list[float]:
    """A column of a run as the re-computation wrote it (verify's --work folder)."""
    shards = root / "work" / "shards" / outcome["computed_run"]
    with duckdb.connect() as con:
        rows = con.execute(
            f"SELECT {column} FROM read_parquet(?) ORDER BY problem_id, sample", [str(shards / "*.parquet")]
        )
        return [r[0] for r in rows.fetchall()]


def submitted(root: Path, run_id: str, column: str) -> list[float]:
    with duckdb.connect(str(root / "runs" / "kvbench.duckdb"), read_only=True) as con:
        rows = con.execute(
            f"SELECT {column} FROM samples WHERE run_id = ? ORDER BY problem_id, sample", [run_id]
        )
        return [r[0] for r in rows.fetchall()]


def test_faked_scores_are_not_what_the_recomputation_gives(tmp_path: Path) -> None:
    bundle = submit(tmp_path, "fake_scores", FAKE_SCORES)
    attacker, null = run_of(bundle, "passkey", "fake-scores"), run_of(bundle, "passkey", "random")
    assert set(submitted(tmp_path, attacker, "metric")) == {1.0}  # the attack worked where it was run
    outcomes = verified(tmp_path, bundle, "--work", "work")
    assert (outcomes[attacker]["outcome"], outcomes[attacker]["claim"]) == ("re-computed", "differs")
    assert set(recomputed(tmp_path, outcomes[attacker], "metric")) != {1.0}  # the honest scores
    assert (outcomes[null]["outcome"], outcomes[null]["claim"]) == ("re-computed", "matches")


def test_a_sabotaged_null_is_recomputed_honestly(tmp_path: Path) -> None:
    bundle = submit(tmp_path, "weak_null", WEAK_NULL)
    null, attacker = run_of(bundle, "passkey", "random"), run_of(bundle, "passkey", "weak-null")
    outcomes = verified(tmp_path, bundle)
    assert (outcomes[null]["outcome"], outcomes[null]["claim"]) == ("re-computed", "differs")
    assert (outcomes[attacker]["outcome"], outcomes[attacker]["claim"]) == ("re-computed", "matches")


def test_a_scorer_reading_the_callers_frames_finds_nothing_in_the_recomputation(tmp_path: Path) -> None:
    bundle = submit(tmp_path, "frame_walker", FRAME_WALKER)
    attacker, null = run_of(bundle, "passkey", "frame-walker"), run_of(bundle, "passkey", "random")
    kept = submitted(tmp_path, attacker, "needle_survival")
    assert min(kept) == 1.0 > max(submitted(tmp_path, null, "needle_survival"))  # it found the needle
    outcomes = verified(tmp_path, bundle, "--work", "work")
    assert (outcomes[attacker]["outcome"], outcomes[attacker]["claim"]) == ("re-computed", "differs")
    assert min(recomputed(tmp_path, outcomes[attacker], "needle_survival")) < 1.0
    assert (outcomes[null]["outcome"], outcomes[null]["claim"]) == ("re-computed", "matches")


def test_a_scorer_that_hangs_under_recomputation_is_stopped_named_and_failed(tmp_path: Path) -> None:
    bundle = submit(tmp_path, "hangs", HANGS_WHEN_CHECKED)
    attacker, null = run_of(bundle, "passkey", "hangs-when-checked"), run_of(bundle, "passkey", "random")
    outcomes = verified(tmp_path, bundle, "--scorer-seconds", "3")
    assert outcomes[attacker]["outcome"] == "failed", outcomes[attacker]
    assert (
        "policy 'hangs-when-checked' at layer 0, eviction event 0: no answer within 3 s"
        in outcomes[attacker]["detail"]
    )
    assert outcomes[null]["outcome"] == "re-computed", outcomes[null]  # the null does not wait on it


def test_a_scorer_whose_forks_hold_more_than_the_memory_limit_together_is_stopped_and_failed(
    tmp_path: Path,
) -> None:
    bundle = submit(tmp_path, "forks", FORKS_WHEN_CHECKED)
    attacker, null = run_of(bundle, "passkey", "forks-when-checked"), run_of(bundle, "passkey", "random")
    outcomes = verified(tmp_path, bundle, "--scorer-memory", "1")
    assert outcomes[attacker]["outcome"] == "failed", outcomes[attacker]
    detail = outcomes[attacker]["detail"]
    assert "GiB resident in all, over the limit of 1 GiB for all of them (--scorer-memory)" in detail, detail
    assert outcomes[null]["outcome"] == "re-computed", outcomes[null]


def test_a_failures_reason_from_the_scorer_is_stored_and_shown_escaped(tmp_path: Path) -> None:
    """Before: the surrogate ended `verify --db` in DuckDB's traceback with nothing recorded, and the escape
    sequence reached the board's failed-run notice as it was."""
    bundle = submit(tmp_path, "raises", RAISES_ESCAPES_WHEN_CHECKED)
    attacker = run_of(bundle, "passkey", "raises-escapes")
    cli("accept", str(bundle), "--db", "board.duckdb", cwd=tmp_path)
    done = cli("verify", str(bundle), "--db", "board.duckdb", "--quiet", cwd=tmp_path, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    with duckdb.connect(str(tmp_path / "board.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT identity, state, reason FROM submission_runs").fetchall()
    (reason,) = [reason for identity, state, reason in rows if identity == attacker and state == "failed"]
    assert "\\ud800 \\x1b]0;PWNED\\x07\\x1b[31mred \\u202eright-to-left \\u061c" in reason, reason
    assert not any(ord(c) < 32 or 0xD800 <= ord(c) < 0xE000 or c in "\u202e\u061c" for c in reason)
    assert {state for identity, state, _ in rows if identity != attacker} == {"published"}


def test_what_a_scorer_reports_of_itself_under_recomputation_is_held_to_the_text_rule(tmp_path: Path) -> None:
    bundle = submit(tmp_path, "documents", DOCUMENTS_ITSELF_WHEN_CHECKED)
    attacker, null = run_of(bundle, "passkey", "documents-itself"), run_of(bundle, "passkey", "random")
    outcomes = verified(tmp_path, bundle)
    assert outcomes[attacker]["outcome"] == "failed", outcomes[attacker]
    assert "the scorer reported policy_doc" in outcomes[attacker]["detail"]
    assert "(the text rule)" in outcomes[attacker]["detail"]
    assert outcomes[null]["outcome"] == "re-computed", outcomes[null]
