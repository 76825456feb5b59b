"""The documentation reads on GitHub and on the site: GitHub shows a page's Markdown as written (HTML
comments hidden), the site shows it through tools/mkdocs_hooks.py, pymdownx.snippets and mkdocstrings."""

from __future__ import annotations

import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def on_github(page: Path) -> str:
    """What GitHub shows of a page: its Markdown without HTML comments."""
    return re.sub(r"<!--.*?-->", "", page.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md", ROOT / "protocol.md"], ids=lambda p: p.name)
def test_a_page_on_github_shows_no_include_or_directive_line(page: Path) -> None:
    for line in on_github(page).splitlines():
        assert not line.lstrip().startswith(("--8<--", ":::")), f"{page}: GitHub shows {line!r}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_pages_links_on_github_reach_files_of_the_repository(page: Path) -> None:
    for target in LINK.findall(on_github(page)):
        if not re.match(r"[a-z]+:|#", target):
            assert (page.parent / target.split("#")[0]).exists(), f"{page}: {target} is not in the repository"


def test_the_site_shows_the_included_files_and_the_contracts_docstrings(tmp_path: Path) -> None:
    # not --quiet: mkdocs 1.6 drops the warnings before --strict counts them (a broken link would pass)
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)]
    result = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr

    def text(page: str) -> str:
        html = (tmp_path / page / "index.html").read_text()
        article = html[html.index("<article") : html.index("</article>")]
        return " ".join(unescape(re.sub(r"<[^>]+>", " ", article)).split())

    def headings(markdown: Path) -> list[str]:
        return [
            line.lstrip("#").strip().replace("`", "")
            for line in markdown.read_text().splitlines()
            if re.match(r"#{1,3} ", line)
        ]

    for page, source in (
        ("protocol", ROOT / "protocol.md"),
        ("gpu-check", ROOT / "runs/gpu-check/README.md"),
    ):
        shown = text(page)
        squeezed = shown.replace(" ", "")  # a tag's edge (`code`: ...) leaves a space in the text
        assert all(heading.replace(" ", "") in squeezed for heading in headings(source)), page
        assert "--8<--" not in shown and "repository root" not in shown  # the GitHub-only lines are not
    scorers = text("scorers")
    html = (tmp_path / "scorers" / "index.html").read_text()
    members = ("Policy", "Policy.score", "Policy.observe", "Policy.evicts", "EvictionView", "policy")
    assert all(f'id="kvbench.core.contract.{member}"' in html for member in members)
    assert "Base class of every scorer" in scorers  # Policy's docstring, rendered
    assert ":::" not in scorers and "suite/core/contract.py" not in scorers
