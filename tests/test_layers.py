"""`make lint`'s import-linter contracts (pyproject.toml) hold on the real package, and they bite: with one
kept exception removed, or one real upward import added back, lint-imports names the broken contract."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
CONFIG = (ROOT / "pyproject.toml").read_text()


def lint_imports(config: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(ROOT / "tools" / "importlint.py"), str(config)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def contracts() -> dict[str, dict]:
    return {c["id"]: c for c in tomllib.loads(CONFIG)["tool"]["importlinter"]["contracts"]}


def test_the_real_package_keeps_every_contract() -> None:
    done = lint_imports(ROOT / "pyproject.toml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(contracts())} kept, 0 broken." in done.stdout


@pytest.mark.parametrize(
    ("contract", "exception", "shown"),
    [
        (
            "layers",
            "kvbench.adapters.hf.models -> kvbench.specs.model",
            "kvbench.adapters.hf.models -> kvbench.specs.model",
        ),
        (
            "leaderboard-without-torch",
            "kvbench.specs.protocol -> kvbench.core.precision",
            "kvbench.core.quantize -> torch",
        ),
    ],
)
def test_removing_an_exception_breaks_its_contract(
    tmp_path: Path, contract: str, exception: str, shown: str
) -> None:
    line = f'"{exception}",'
    assert exception in contracts()[contract]["ignore_imports"]
    text = CONFIG
    if contract != "layers":  # the same line may stand in an earlier contract: cut it from this one only
        head, tail = text.split(f'id = "{contract}"', 1)
        text = head + f'id = "{contract}"' + tail.replace(line, "", 1)
    else:
        text = text.replace(line, "", 1)
    config = tmp_path / "pyproject.toml"
    config.write_text(text)
    done = lint_imports(config)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"Contracts: {len(contracts()) - 1} kept, 1 broken." in done.stdout
    assert f"{contracts()[contract]['name']} BROKEN" in done.stdout
    assert shown in done.stdout


def test_the_leaderboard_contract_follows_imports_through_kvbench(tmp_path: Path) -> None:
    """The leaderboard reaches scipy only through kvbench.results.stats: forbidding scipy in torch's place
    breaks the contract, so a torch import anywhere under the leaderboard's kvbench imports would too."""
    config = tmp_path / "pyproject.toml"
    config.write_text(CONFIG.replace('forbidden_modules = ["torch"]', 'forbidden_modules = ["scipy"]'))
    done = lint_imports(config)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{contracts()['leaderboard-without-torch']['name']} BROKEN" in done.stdout
    assert "kvbench.results.stats -> scipy" in done.stdout


def test_the_runners_layers_count_an_import_made_for_type_checking(tmp_path: Path) -> None:
    """The runner once had a circle through imports made only for type checking (sources naming execute's
    Graders while execute imported sources): with such an import put back, the runner's contract breaks."""
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / "tools" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    typecheck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(typecheck)
    typecheck.link_tree(tmp_path)  # the package as tools/importlint.py lays it out, one file replaced
    sources = tmp_path / "kvbench" / "runner" / "sources.py"
    text = sources.read_text().replace("from typing import ", "from typing import TYPE_CHECKING, ")
    sources.unlink()
    sources.write_text(text + "\nif TYPE_CHECKING:\n    from kvbench.runner.execute import Replica\n")
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [lint_imports, "--no-cache", str(ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"Contracts: {len(contracts()) - 1} kept, 1 broken." in done.stdout
    assert f"{contracts()['runner-layers']['name']} BROKEN" in done.stdout
    assert "kvbench.runner.sources -> kvbench.runner.execute" in done.stdout
