"""CI's environment is the lock's: the reference `kvbench check` holds outputs against was written with
exactly the lock's versions, so the output-digest check stays armed; moving the lock moves the reference."""

from __future__ import annotations

import json
import re
from pathlib import Path

import tomllib

from kvbench.provenance import PACKAGES

ROOT = Path(__file__).resolve().parents[1]


def pins() -> dict[str, str]:
    text = (ROOT / "requirements" / "lock.txt").read_text()
    return {m[0].lower(): m[1] for m in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, flags=re.M)}


def test_the_reference_was_written_with_the_locked_versions() -> None:
    manifest = json.loads((ROOT / "runs" / "reference" / "ci.json").read_text())["manifest"]
    locked = pins()
    assert {name: locked[name] for name in PACKAGES} == manifest["packages"], (
        "requirements/lock.txt and runs/reference/ci.json disagree: after `make lock`, run "
        "`kvbench check --suite ci --update-reference` in the locked venv and commit both"
    )


def test_every_declared_dependency_is_locked() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    names = {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].lower() for d in declared}
    assert names - set(pins()) == set()
    assert pins()["torch"] == "2.13.0+cpu"  # the CPU wheel, never a CUDA build
