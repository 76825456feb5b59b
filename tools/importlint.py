"""Check pyproject.toml's import-linter contracts on the `kvbench` package as Python imports it.

import-linter (grimp) finds a package's modules in its folder, and pyproject.toml's package-dir mapping
puts policies/, adapters/ and leaderboard/ inside `kvbench`, which the editable install serves through
an import hook grimp does not follow. So, as tools/typecheck.py does for mypy, this lays the package out
as links in a temporary folder and runs lint-imports there.
Usage: python tools/importlint.py [CONFIG_FILE] [lint-imports options]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from typecheck import ROOT, link_tree


def main() -> int:
    arguments = sys.argv[1:]
    if not arguments or arguments[0].startswith("-"):
        arguments = [str(ROOT / "pyproject.toml"), *arguments]
    arguments[0] = str(Path(arguments[0]).resolve())
    with tempfile.TemporaryDirectory(prefix="kvbench-importlint-") as tmp:
        link_tree(Path(tmp))
        lint_imports = Path(sys.executable).with_name("lint-imports")
        environment = {**os.environ, "PYTHONPATH": tmp}
        return subprocess.run([lint_imports, "--no-cache", *arguments], cwd=tmp, env=environment).returncode


if __name__ == "__main__":
    sys.exit(main())
