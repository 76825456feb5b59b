"""Type-check the `kvbench` package as Python imports it, and report errors at their source paths.

mypy resolves modules from folders, and pyproject.toml maps import packages onto other folder names
(`kvbench` -> suite/, `kvbench.policies` -> policies/, ...): an editable install serves that mapping
through an import hook that mypy does not run. So this script lays out the package as links in a
temporary folder, runs mypy there with the project's configuration, and rewrites the paths it prints
back to the files in the repository. Usage: python tools/typecheck.py [mypy options]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def source_folder(package: str, mapping: dict[str, str]) -> Path:
    """The repository folder of an import package: its longest mapped parent, then its own name."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        parent = ".".join(parts[:cut])
        if parent in mapping:
            return ROOT / mapping[parent] / Path(*parts[cut:])
    return ROOT / Path(*parts)


def link_tree(target: Path) -> dict[str, str]:
    """Links to every module of the package under ``target``; returns link path -> repository path."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    links = {}
    for package in setuptools["packages"]:
        folder = target / package.replace(".", "/")
        folder.mkdir(parents=True, exist_ok=True)
        for module in sorted(source_folder(package, setuptools["package-dir"]).glob("*.py")):
            (folder / module.name).symlink_to(module)
            links[str(folder / module.name)] = str(module.relative_to(ROOT))
    return links


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="kvbench-typecheck-") as tmp:
        links = link_tree(Path(tmp))
        command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
        command += ["--cache-dir", str(ROOT / ".mypy_cache"), *sys.argv[1:]]
        done = subprocess.run([*command, "kvbench"], cwd=tmp, capture_output=True, text=True)
    for stream, text in ((sys.stdout, done.stdout), (sys.stderr, done.stderr)):
        for link, source in sorted(links.items(), key=lambda item: -len(item[0])):
            text = text.replace(link, source).replace(str(Path(link).relative_to(tmp)), source)
        stream.write(text)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
