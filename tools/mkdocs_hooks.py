"""mkdocs hook: a page reads on GitHub and on the site from the same Markdown.

GitHub shows a page's Markdown as written and hides its HTML comments. The site needs two things GitHub
cannot show: a file included from outside docs/ (pymdownx.snippets' `--8<--` line) and the reference
rendered from docstrings (mkdocstrings' `:::` line). A page writes those inside a comment opened by a line
`<!-- site` and closed by a line `-->`, and writes what a GitHub reader needs instead (a link to the
file) between the lines `<!-- github -->` and `<!-- /github -->`. For the site this hook opens the first
and drops the second, before Markdown (snippets and mkdocstrings with it) reads the page.
"""

from __future__ import annotations

import re
from typing import Any

SITE_ONLY = re.compile(r"^<!-- site\n(.*?)^-->$\n?", re.DOTALL | re.MULTILINE)
GITHUB_ONLY = re.compile(r"^<!-- github -->\n.*?^<!-- /github -->$\n?", re.DOTALL | re.MULTILINE)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """The page as the site reads it: site-only blocks opened, GitHub-only blocks dropped."""
    return SITE_ONLY.sub(r"\1", GITHUB_ONLY.sub("", markdown))
