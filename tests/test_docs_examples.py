"""Every `kvbench ...` command the README and the documentation show is checked.

An indented command (a Markdown code block of four spaces) runs as written, through kvbench's command
line in this process (tests/invoke.py: the `kvbench` script's own entry point, without a new interpreter
per command), in one scratch folder, in reading order: the README, then protocol.md, then the site's
pages in the order of mkdocs.yml's nav (tests/test_cli.py starts the installed script itself). A command
in a fenced block needs what a test cannot have (a GPU, a cluster, a server that keeps running): it must
still parse with kvbench's own argument parser, so a renamed or mistyped flag fails here.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from invoke import kvbench

from kvbench.cli import build_parser
from kvbench.commands import lmeval

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def documents() -> list[Path]:
    """The README, protocol.md, then every page of the site in nav order (docs/protocol.md includes
    protocol.md, so it is read once)."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = [ROOT / "docs" / next(iter(entry.values())) for entry in nav]
    return [ROOT / "README.md", ROOT / "protocol.md", *(p for p in pages if p.name != "protocol.md")]


def _commands(text: str, fenced: bool) -> list[str]:
    found: list[str] = []
    inside = False
    pending = ""
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        if fenced and inside:
            pending += line.rstrip("\\").strip() + " "
            if line.endswith("\\"):
                continue
            match = re.search(r"(?:^|\s|/)(kvbench\s.+)$", pending.strip())
            pending = ""
            if match and not match.group(1).startswith("kvbench."):
                found.append(match.group(1))
        elif not fenced and not inside:
            match = re.match(r"^ {4}(kvbench .+)$", line)
            if match:
                found.append(match.group(1))
    return [shlex.join(shlex.split(c, comments=True)) for c in found]


def runnable(docs: list[Path] | None = None) -> list[str]:
    """Indented commands in reading order, each once."""
    found = (c for doc in docs or documents() for c in _commands(doc.read_text(), fenced=False))
    return list(dict.fromkeys(found))


def parse_only() -> list[tuple[str, str]]:
    run = set(runnable())
    return [(d.name, c) for d in documents() for c in _commands(d.read_text(), fenced=True) if c not in run]


def test_every_nav_page_exists_and_every_readme_link_resolves() -> None:
    missing = [p for p in documents() if not p.is_file()]
    assert missing == []
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)\)", readme)
    assert len(links) >= 10
    assert [link for link in links if "://" not in link and not (ROOT / link).exists()] == []


def test_the_docs_have_commands_of_both_kinds() -> None:
    assert len(runnable()) >= 15
    assert len(parse_only()) >= 8
    # the README's first lines are the two set-up commands
    first = (ROOT / "README.md").read_text().splitlines()[2:4]
    assert [line.split("#")[0].strip() for line in first] == ["make run", "make test"]


@pytest.mark.parametrize("doc, command", parse_only())
def test_fenced_commands_parse(doc: str, command: str) -> None:
    args = shlex.split(command)[1:]
    if args[:1] == [lmeval.COMMAND]:  # lm-eval's own flags are lm-eval's to parse, as in kvbench.cli.main
        args = [lmeval.COMMAND, "--", *args[1:]]
    try:
        build_parser().parse_args(args)
    except SystemExit as exc:
        pytest.fail(f"{doc}: `{command}` does not parse (exit {exc.code})")


@pytest.mark.slow
def test_indented_commands_run_in_order(tmp_path: Path) -> None:
    """In one scratch folder, in reading order: later commands use what earlier ones wrote (runs,
    calibration, a scorer written by `kvbench new-policy`), and a run that grows an earlier one's
    --limit computes only the new problems, as it would for a reader. Offline, like `make run`: the
    README's main job (`kvbench run --policy snapkv --protocol protect-prompt`, here at --limit 2) on the
    embedded SmolLM2 ends with a table per quick-suite task."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    commands = runnable()
    assert len(commands) >= 15
    shown = {}
    for command in commands:
        program, *args = shlex.split(command)
        assert program == "kvbench"
        result = kvbench(*args, cwd=tmp_path, env=env)
        assert result.returncode == 0, f"`{command}`\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
        shown[command] = result.stdout
    assert [p.name for p in sorted((tmp_path / "scorers").glob("*.py"))] == ["my_scorer.py"]
    main_job = shown["kvbench run --policy snapkv --protocol protect-prompt --limit 2"]
    assert "fidelity on smollm2-135m" in main_job
    # the null's and the full cache's first problem come from the README's --limit 1 run
    assert "4 problems computed, 2 reused" in main_job


def test_the_protocol_names_every_stored_field() -> None:
    """protocol.md, section 11, is complete: a column added to the store without a word there fails."""
    from kvbench.store.records import RunRecord, SampleRecord

    text = (ROOT / "protocol.md").read_text()
    store = text[text.index("## 11. What the store holds") :]
    missing = [
        f"{record.__name__}.{field}"
        for record in (SampleRecord, RunRecord)
        for field in record.model_fields
        if f"`{field}`" not in store
    ]
    assert missing == []
