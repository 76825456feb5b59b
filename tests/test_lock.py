"""CI's environment is the lock's: the reference `kvbench check` holds outputs against was written with
exactly the lock's versions, so the output-digest check stays armed; moving the lock moves the reference."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from kvbench.provenance import PACKAGES

ROOT = Path(__file__).resolve().parents[1]


def pins() -> dict[str, str]:
    text = (ROOT / "requirements" / "lock.txt").read_text()
    return {m[0].lower(): m[1] for m in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, flags=re.M)}


def test_the_reference_was_written_with_the_locked_versions() -> None:
    manifest = json.loads((ROOT / "runs" / "reference" / "ci.json").read_text())["manifest"]
    locked = pins()
    # the manifest holds installed versions (torch's CPU wheel calls itself 2.13.0+cpu); the lock pins
    # public versions, which match any local build of them (PEP 440)
    installed = {name: str(v).split("+")[0] for name, v in manifest["packages"].items()}
    assert {name: locked[name] for name in PACKAGES} == installed, (
        "requirements/lock.txt and runs/reference/ci.json disagree: after `make lock`, run "
        "`kvbench check --suite ci --update-reference` in the locked venv and commit both"
    )


def test_every_declared_dependency_is_locked() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    names = {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].lower() for d in declared}
    assert names - set(pins()) == set()
    assert pins()["torch"] == "2.13.0"


def test_the_lock_pins_public_versions_only() -> None:
    """A local label (``+cpu``) exists on no public index: `make venv` would fail wherever pip reaches
    only PyPI. ``torch==2.13.0`` takes the CPU wheel where it is installed first from a CPU index, and
    the CUDA build from PyPI."""
    assert {name: v for name, v in pins().items() if "+" in v} == {}


@pytest.mark.slow
def test_every_pin_of_the_lock_resolves_on_this_index(tmp_path: Path) -> None:
    """Each pin exists on the index pip is configured with here (CI's), without the installed venv's help."""
    report = tmp_path / "report.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-deps",
            "--ignore-installed",
            "-q",
            "-r",
            str(ROOT / "requirements" / "lock.txt"),
            "--report",
            str(report),
        ],
        check=True,
        capture_output=True,
        timeout=900,
    )
    resolved = {
        i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    expected = {name.replace("_", "-"): v for name, v in pins().items()}
    assert {name: v.split("+")[0] for name, v in resolved.items()} == expected
