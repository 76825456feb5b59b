"""Every reference to a Markdown document resolves inside the repository, and the design pages match the code.

A reference is a name ending in `.md` anywhere in the repository's text files (code, comments, docstrings,
pyproject.toml, the Makefile, the README, the docs), optionally followed by `#anchor`, `, section N`
(`sections N and M`, `§N`) or `, "Heading"`. It must name a file of the repository (beside the file that
names it, at the root, or in docs/), and what follows must be a heading of that file. So a docstring that
cites a design note the repository does not ship fails here, not in a contributor's hands.

docs/policies.md and docs/evaluation.md state numbers the code decides (each policy's parameters and
defaults, each task's samples and budget, each family's sampling): those are read back from the code.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

from kvbench.registry import builtin_policies
from kvbench.specs.protocol import load_protocol, protocol_names
from kvbench.specs.task import load_task

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".cfg", ".ini", ".sh", ".js", ""}
SECTION = r"\d+[a-z]?"
REFERENCE = re.compile(
    r"(?<![\w/.\-])"  # not the tail of a longer path or of a URL
    r"((?:\.\./)*(?:[\w.\-]+/)*[\w\-]+\.md)"  # the document
    r"(?:#([\w\-]+))?"  # an anchor
    r"\)?"  # the end of a Markdown link around it
    # section N, sections N and M, §N
    rf"(?:,?\s+(?:sections?\s+|§\s*)({SECTION}(?:(?:,\s*|\s+and\s+){SECTION})*)"
    r'|,\s+"([^"]+)")?'  # or a quoted heading
)
BARE_SECTION = re.compile(rf"(?:\bsections?\s+|§\s*)({SECTION}(?:(?:,\s*|\s+and\s+){SECTION})*)\b", re.I)
NUMBERED = re.compile(rf"^({SECTION})\.\s")


def repository_files(root: Path) -> list[Path]:
    """The text files of the repository: tracked or new, never ignored (a venv, results, the built site)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    paths = [root / name for name in listed if name]
    return sorted(p for p in paths if p.is_file() and p.suffix in TEXT_SUFFIXES and _is_text(p))


def _is_text(path: Path) -> bool:
    try:
        path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return False
    return True


def headings(page: Path, root: Path) -> list[str]:
    """A Markdown file's headings as written (code spans and links reduced to their text), with those of
    the files it includes for the site (pymdownx.snippets' `--8<-- "FILE"`, relative to the root)."""
    found: list[str] = []
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6}\s+(.+?)\s*#*$", line)):
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))
            found.append(text.replace("`", "").replace("*", ""))
        elif included := re.match(r'--8<--\s+"([^"]+)"', line.strip()):
            found += headings(root / included.group(1), root)
    return found


def slugs(heading: str) -> set[str]:
    """The anchors the site (Python-Markdown's toc) and GitHub give a heading."""
    ascii_text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    site = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_text).strip().lower())
    github = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    return {site, github}


def numbered(found: list[str]) -> set[str]:
    return {m.group(1) for h in found if (m := NUMBERED.match(h))}


def broken_references(files: list[Path], root: Path) -> list[str]:
    """`file:line: why` for every reference in ``files`` that does not resolve."""
    broken: list[str] = []
    for source in files:
        text = source.read_text(encoding="utf-8")
        spans: list[tuple[int, int]] = []
        for match in REFERENCE.finditer(text):
            spans.append(match.span())
            name, anchor, sections, quoted = match.groups()
            where = f"{source.relative_to(root)}:{text.count(chr(10), 0, match.start()) + 1}"
            target = next(
                (base / name for base in (source.parent, root, root / "docs") if (base / name).is_file()),
                None,
            )
            if target is None:
                broken.append(f"{where}: {name} is not in the repository")
                continue
            found = headings(target, root)
            if anchor and not any(anchor in slugs(h) for h in found):
                broken.append(f"{where}: {name} has no heading #{anchor}")
            for number in re.findall(SECTION, sections or ""):
                if number not in numbered(found):
                    broken.append(f"{where}: {name} has no section {number}")
            heading = " ".join(re.sub(r"\n\s*#", " ", quoted or "").split())  # a comment's lines joined
            if heading and not any(heading.lower() in h.lower() for h in found):
                broken.append(f'{where}: {name} has no heading "{heading}"')
        if source.suffix == ".md" and (own := numbered(headings(source, root))):
            # a numbered document's bare "section N" is one of its own sections
            for match in BARE_SECTION.finditer(text):
                if any(start <= match.start() < end for start, end in spans):
                    continue
                where = f"{source.relative_to(root)}:{text.count(chr(10), 0, match.start()) + 1}"
                broken += [
                    f"{where}: no section {n} here"
                    for n in re.findall(SECTION, match.group(1))
                    if n not in own
                ]
    return broken


def test_every_reference_to_a_document_resolves_inside_the_repository() -> None:
    files = repository_files(ROOT)
    assert ROOT / "pyproject.toml" in files and ROOT / "Makefile" in files and ROOT / "README.md" in files
    found = [match for path in files for match in REFERENCE.finditer(path.read_text(encoding="utf-8"))]
    assert len(found) > 200 and sum(bool(m.group(3)) for m in found) > 20  # the pattern finds them
    assert broken_references(files, ROOT) == []


MD = ".md"  # the fixtures below name documents through it, so that this file itself cites none


def test_a_reference_to_a_missing_document_or_heading_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / f"protocol{MD}").write_text(
        "# P\n\n## 2. The schedule\n\n## 7a. Telemetry\n\nAs section 2 says.\n"
    )
    (tmp_path / "docs" / f"page{MD}").write_text(
        f'<!-- site\n--8<-- "protocol{MD}"\n-->\n## A `code` heading\n'
    )
    good = tmp_path / "good.py"
    good.write_text(
        f'"""protocol{MD}, section 2; (protocol{MD}, "The\n    schedule"); protocol{MD} §7a; '
        f'[p](docs/page{MD}#a-code-heading), page{MD}#2-the-schedule; https://example.org/x/DESIGN{MD}"""\n'
        f'# in a comment (protocol{MD}, "The\n# schedule")\n'
    )
    assert broken_references([good, tmp_path / f"protocol{MD}"], tmp_path) == []
    bad = tmp_path / "bad.py"
    bad.write_text(
        f"# DESIGN{MD}, section 9\n# see POLICIES{MD}\n# protocol{MD}, sections 2 and 8\n"
        f'# docs/page{MD}#no-such-heading\n# protocol{MD}, "Retention"\n'
    )
    (tmp_path / "docs" / f"numbered{MD}").write_text("## 1. One\n\nSee section 3.\n")
    assert broken_references([bad, tmp_path / "docs" / f"numbered{MD}"], tmp_path) == [
        f"bad.py:1: DESIGN{MD} is not in the repository",
        f"bad.py:2: POLICIES{MD} is not in the repository",
        f"bad.py:3: protocol{MD} has no section 8",
        f"bad.py:4: docs/page{MD} has no heading #no-such-heading",
        f'bad.py:5: protocol{MD} has no heading "Retention"',
        f"docs/numbered{MD}:3: no section 3 here",
    ]


# -- docs/policies.md: a section per built-in, its parameters and defaults as the code has them ------------
POLICIES_PAGE = ROOT / "docs" / "policies.md"


def page_sections(page: Path) -> dict[str, str]:
    """The page's `## ` sections by heading."""
    parts = re.split(r"^## (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def table_rows(text: str) -> list[list[str]]:
    """The cells of a Markdown table's body rows (backticks removed)."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip().replace("`", "") for cell in row.strip("|").split("|")] for row in rows[2:]]


def test_the_policies_page_has_each_builtin_with_its_parameters_and_each_file_points_to_it() -> None:
    sections = page_sections(POLICIES_PAGE)
    builtins = {ref.cls.name: ref.cls for ref in builtin_policies().values()}
    assert set(builtins) <= set(sections)
    for name, cls in builtins.items():
        documented = {row[0]: row[1] for row in table_rows(sections[name])}
        defaults = {key: str(value) for key, value in cls().params().items()}
        assert documented == defaults, name
        module = __import__(cls.__module__, fromlist=["_"])
        assert f"docs/policies.md#{name}" in (module.__doc__ or ""), cls.__module__


# -- docs/evaluation.md: each reasoning task's numbers and each family's sampling, as the specs set them ----
EVALUATION_PAGE = ROOT / "docs" / "evaluation.md"


def test_the_evaluation_page_states_the_tasks_budgets_and_sampling_the_specs_set() -> None:
    sections = page_sections(EVALUATION_PAGE)
    protocol = load_protocol("protect-prompt")
    rows = table_rows(sections["Tasks"])
    assert len(rows) == 7
    for task_name, _dataset, grader, samples, max_new, n_avg, budget in rows:
        task = load_task(task_name)
        declared = task.reference_n_avg("qwen3-4b")
        assert declared is not None
        assert grader.split()[0] == task.grader, task_name
        assert (int(samples), int(max_new), float(n_avg)) == (task.samples, task.max_new_tokens, declared)
        assert int(budget) == protocol.budget.budget(declared, protocol.buffer), task_name
    sampling = {row[0].split()[0]: tuple(row[1:]) for row in table_rows(sections["Sampling"])}
    for name in protocol_names():
        for family, spec in load_protocol(name).sampling.items():
            top_k = "off" if spec.top_k == 0 else str(spec.top_k)
            assert sampling[family] == (str(spec.temperature), str(spec.top_p), top_k), (name, family)


@pytest.mark.parametrize("page", [POLICIES_PAGE, EVALUATION_PAGE, ROOT / "docs" / "architecture.md"])
def test_the_design_pages_are_in_the_site(page: Path) -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(rf"^\s+- [^:]+: {page.name}$", nav, flags=re.M)
