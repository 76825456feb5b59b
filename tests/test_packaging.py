"""`pip install .` must give the same package as the editable checkout: the folder mapping works."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_maps_the_top_level_folders_into_one_package(tmp_path: Path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("kvbench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "kvbench/core/engine.py",
        "kvbench/specs/loading.py",
        "kvbench/policies/rkv.py",
        "kvbench/policies/scoring.py",
        "kvbench/leaderboard/__init__.py",
        "kvbench/cli.py",
    ):
        assert expected in names
    assert not any(n.startswith(("policies/", "suite/", "adapters/", "tests/")) for n in names)
    # the synthetic backend drives only the tests: it lives in tests/, not in what users install
    assert not any("synthetic" in n for n in names if n.startswith("kvbench/adapters/"))
    # every package of the source tree is in the wheel: a subpackage missing from pyproject's list is not
    mapped = {"suite": "kvbench", "policies": "kvbench/policies", "adapters": "kvbench/adapters",
              "leaderboard": "kvbench/leaderboard", "tasks": "kvbench/tasks"}  # fmt: skip
    for folder, package in mapped.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            assert f"{package}/{init.relative_to(ROOT / folder).as_posix()}" in names

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import kvbench, kvbench.policies.rkv, kvbench.adapters.base; print(kvbench.__file__)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip().startswith(str(site))
    listing = subprocess.run(
        [sys.executable, "-m", "kvbench", "list", "policies"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert listing.returncode == 0 and "vase-attnv\t" in listing.stdout
