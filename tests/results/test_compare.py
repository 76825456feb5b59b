"""kvbench compare: the stored policies against the null, as a table, JSON, CSV or Markdown."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from invoke import kvbench

KVBENCH = str(Path(sys.executable).parent / "kvbench")


FIDELITY = ["--model", "tiny-qwen3", "--task", "fidelity"]
TWO_POLICIES = ["run", *FIDELITY, "--policy", "snapkv", "--policy", "streaming", "--limit", "3", "--quiet"]


def test_compare_formats_and_filters(tmp_path: Path) -> None:
    missing = kvbench("compare", cwd=tmp_path)
    assert missing.returncode == 2 and "run `kvbench run`" in missing.stderr
    run = kvbench(*TWO_POLICIES, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    rows = json.loads(kvbench("compare", "--format", "json", cwd=tmp_path).stdout)
    assert [(r["policy"], r["budget"], r["problems"]) for r in rows] == [
        ("snapkv", 256, 3),
        ("streaming", 256, 3),
    ]
    verdicts = ("beats null", "equivalent to null", "inconclusive", "loses to null")
    assert all(r["verdict"] in verdicts for r in rows)
    assert all(r["wins"] + r["ties"] + r["losses"] == 3 and r["delta_full"] < 0 for r in rows)
    table = list(csv.DictReader(io.StringIO(kvbench("compare", "--format", "csv", cwd=tmp_path).stdout)))
    assert [row["policy"] for row in table] == ["snapkv", "streaming"]
    markdown = kvbench("compare", "--format", "markdown", cwd=tmp_path).stdout
    assert (
        markdown.splitlines()[0].startswith("| model | task | runtime | K | K/N_avg | policy |")
        and "| snapkv |" in markdown
    )
    against = json.loads(
        kvbench("compare", "--against", "streaming", "--format", "json", cwd=tmp_path).stdout
    )
    assert {r["policy"] for r in against} == {"snapkv", "random"}
    injected = kvbench("compare", "--task", "' OR 1=1 --", "--format", "json", cwd=tmp_path)
    assert injected.returncode == 0 and json.loads(injected.stdout) == []
    _tables_fit_100_columns(tmp_path, rows)


def _tables_fit_100_columns(folder: Path, rows: list[dict]) -> None:
    """In a terminal 100 columns wide, `kvbench run`'s and `compare`'s tables are whole: no cell cut or
    wrapped, each policy one line with its score and Δ as value ± half-width and its verdict with the Holm
    p."""
    short = {"beats null": "beats", "loses to null": "loses", "equivalent to null": "equivalent"}
    for args in (TWO_POLICIES, ["compare"]):
        shown = in_terminal([KVBENCH, *args], folder, columns=100)
        assert "…" not in shown and max(len(line) for line in shown.splitlines()) <= 100, shown
        for r in rows:
            (line,) = [x for x in shown.splitlines() if x.startswith(f"│ {r['policy']} ")]
            score = f"{r['score']:.3f} ± {(r['score_high'] - r['score_low']) / 2:.3f}"
            delta = f"{r['delta']:+.3f} ± {(r['delta_high'] - r['delta_low']) / 2:.3f}"
            verdict = f"{short.get(r['verdict'], r['verdict'])} p={r['p_holm']:.3f}"
            assert score in line and delta in line and verdict in line and "3 × 1" in line, line

    # piped, a table is as wide as its cells, as in the terminal (docs/results.md), not 160 columns
    piped = subprocess.run([KVBENCH, "compare"], capture_output=True, text=True, cwd=folder).stdout

    def table(text: str) -> list[str]:
        return [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]

    assert table(piped) == table(shown) and len(table(shown)[0]) < 100
    wide = in_terminal([KVBENCH, "compare", "--wide"], folder, columns=100)
    piped = subprocess.run([KVBENCH, "compare", "--wide"], capture_output=True, text=True, cwd=folder).stdout
    for shown, width in ((wide, 100), (piped, 160)):
        _every_field_whole(shown, rows, width)


def _every_field_whole(shown: str, rows: list[dict], width: int) -> None:
    """`--wide` within ``width`` columns: every field of every row (W/T/L, margin / MDE and the token costs
    too) beside its name, no cell cut to "…" (a long value, such as a verdict with its power plan, may go
    on over the next lines of its own cell, whole), no line wider."""
    from kvbench.results.compare import HEADER, display_cells

    lines = shown.splitlines()
    assert "…" not in shown and max(len(line) for line in lines) <= width, shown
    for row in rows:
        titles = [i for i, x in enumerate(lines) if x.startswith(f"{row['policy']}: {row['task']} on ")]
        assert len(titles) == 1, f"no block of its own for {row['policy']}:\n{shown}"
        cells = _block_cells(lines[titles[0] + 2 :])
        for field, value in zip(HEADER, display_cells(row), strict=True):
            assert cells.get(field) == value, (field, value, shown)


def _block_cells(lines: list[str]) -> dict[str, str]:
    """A per-row block's field -> value, a value's continuation lines (an empty field cell) joined."""
    cells: dict[str, str] = {}
    field = ""
    for line in lines:
        parts = re.fullmatch(r"│ (.*?) +│ (.*?) *│", line)
        if parts is None:
            break
        if parts[1].strip():
            field = parts[1].strip()
            cells[field] = parts[2]
        else:
            cells[field] += " " + parts[2]
    return cells


def test_wide_is_one_table_where_it_fits_and_a_block_per_row_where_it_does_not() -> None:
    from rich.console import Console

    from kvbench.commands.wide_table import wide_view
    from kvbench.results.compare import COLUMNS, HEADER, display_cells

    rows = []  # every field at its longest: what a long model, runtime and verdict make of a row
    for policy, verdict in (("rkv-official", "inconclusive"), ("snapkv", "equivalent to null")):
        row = dict.fromkeys(COLUMNS, 0.5) | {"budget": 4096, "ratio": None, "seed": 12345, "submission": ""}
        rows.append(
            row
            | {"policy": policy, "verdict": verdict, "model": "phi-4-reasoning", "task": "gpqa-diamond"}
            | {"runtime": "hf/cuda/bfloat16/flash_attention_2", "problems_needed": 19765, "wins": 11}
            | {"ties": 2, "losses": 185, "margin": 0.02, "minimum_detectable_effect": 0.125}
            | {"problems_needed_for": "equivalent to null"}
        )
    for width in (100, 160):
        narrow = Console(width=width, record=True, file=io.StringIO())
        narrow.print(wide_view(rows, "title", narrow))
        _every_field_whole(narrow.export_text(), rows, width)
    roomy = Console(width=1000, record=True, file=io.StringIO())
    roomy.print(wide_view(rows, "title", roomy))
    table = roomy.export_text().splitlines()
    (header,) = [line for line in table if line.startswith("┃")]
    assert [cell.strip() for cell in header.split("┃")[1:-1]] == list(HEADER)
    for row in rows:
        (line,) = [x for x in table if f"│ {row['policy']} " in x]
        assert [cell.strip() for cell in line.split("│")[1:-1]] == display_cells(row)


def in_terminal(command: list[str], cwd: Path, columns: int) -> str:
    """What ``command`` shows in a terminal ``columns`` wide (a pseudo-terminal of that size), colours
    and cursor codes removed."""
    import fcntl
    import os
    import pty
    import re
    import struct
    import termios

    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # the terminal's size rules
    process = subprocess.Popen(command, cwd=cwd, stdin=child, stdout=child, stderr=child, env=env)
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert process.wait(timeout=600) == 0, b"".join(chunks).decode(errors="replace")
    os.close(main)
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def test_declared_task_groups_are_pooled_by_task_and_problem(tmp_path: Path) -> None:
    run = kvbench(
        "run",
        *("--model", "tiny-qwen3", "--task", "passkey", "--task", "planted-fact", "--policy", "streaming"),
        *("--limit", "3", "--quiet"),
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    pooled = kvbench("compare", "--pool", "probes=passkey,planted-fact", "--format", "json", cwd=tmp_path)
    rows = json.loads(pooled.stdout)
    group = [r for r in rows if r["task"] == "probes"]
    assert [(r["policy"], r["budget"], r["ratio"], r["problems"]) for r in group] == [
        ("streaming", None, 4.0, 6)
    ]
    con = duckdb.connect(str(tmp_path / "runs" / "kvbench.snapshot.duckdb"), read_only=True)
    (expected,) = con.execute(
        "SELECT avg(score) FROM (SELECT s.task, s.problem_id, avg(s.metric) AS score FROM samples s "
        "JOIN runs r USING (run_id) WHERE r.policy = 'streaming' GROUP BY s.task, s.problem_id)"
    ).fetchone()
    assert group[0]["score"] == pytest.approx(expected)
    assert group[0]["wins"] + group[0]["ties"] + group[0]["losses"] == 6
    bad = kvbench("compare", "--pool", "probes=passkey", cwd=tmp_path)
    assert bad.returncode == 2 and "two or more tasks" in bad.stderr


def test_a_larger_rerun_of_an_arm_supersedes_the_smaller_one(tmp_path: Path) -> None:
    for limit in ("1", "3"):
        args = (*FIDELITY, "--policy", "snapkv", "--limit", limit, "--quiet")
        assert kvbench("run", *args, cwd=tmp_path).returncode == 0
    rows = json.loads(kvbench("compare", "--format", "json", cwd=tmp_path).stdout)
    assert [(r["policy"], r["problems"], r["excluded"]) for r in rows] == [("snapkv", 3, 0)]
    for task in ("passkey", "planted-fact"):
        args = ("--model", "tiny-qwen3", "--task", task, "--policy", "snapkv", "--limit", "1", "--quiet")
        assert kvbench("run", *args, cwd=tmp_path).returncode == 0
    pooled = kvbench(
        "compare", "--pool", "one=passkey,planted-fact", "--budget", "999", "--format", "json", cwd=tmp_path
    )
    assert json.loads(pooled.stdout) == []  # --budget applies to pooled rows too


def test_a_policy_name_with_rich_markup_or_emoji_codes_is_refused_as_it_is(tmp_path: Path) -> None:
    """@policy refuses the name (docs/scorers.md#policy-names), and the refusal prints it as written:
    neither Rich markup nor an emoji code."""
    name = "k[/]:x:"
    (tmp_path / "scorer.py").write_text(
        "from kvbench import EvictionView, Policy, policy\n\n\n"
        f"@policy({name!r})\nclass Marked(Policy):\n"
        '    """Keeps the keys of largest norm."""\n\n'
        "    def score(self, view: EvictionView):\n        return view.keys.float().norm(dim=-1)\n"
    )
    run = kvbench(
        *("run", "--model", "tiny-qwen3", "--task", "passkey", "--policy", "scorer.py:Marked"),
        *("--limit", "1", "--samples", "1", "--quiet"),
        cwd=tmp_path,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"policy name {name!r} is not allowed" in run.stderr and "❌" not in run.stderr, run.stderr


def test_an_empty_snapshot_is_named_with_how_to_rebuild_it(small_results: Path, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    shutil.copytree(small_results, root)
    snapshot = root / "kvbench.snapshot.duckdb"
    snapshot.write_bytes(b"")  # as a full disk or a killed copy leaves it
    done = kvbench("compare", "--db", str(snapshot), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(f"kvbench: {snapshot} cannot be read: it is damaged"), done.stderr
    assert f"`kvbench ingest --rebuild --out {root}`" in done.stderr and "Traceback" not in done.stderr
    assert kvbench("ingest", "--rebuild", "--out", str(root), cwd=tmp_path).returncode == 0
    assert kvbench("compare", "--db", str(snapshot), cwd=tmp_path).returncode == 0
