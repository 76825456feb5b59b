"""Every `kvbench ...` example in README.md and protocol.md runs as written (in a scratch folder)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KVBENCH = str(Path(sys.executable).parent / "kvbench")


def examples() -> list[tuple[str, str]]:
    found = []
    for doc in ("README.md", "protocol.md"):
        for line in (ROOT / doc).read_text().splitlines():
            match = re.match(r"^ {4}(kvbench .+?)(\s+#.*)?$", line)
            if match:
                found.append((doc, match.group(1).strip()))
    return found


def test_the_docs_have_examples() -> None:
    assert len(examples()) >= 6


@pytest.mark.slow
@pytest.mark.parametrize("doc", ["README.md", "protocol.md"])
def test_examples_run_in_order(doc: str, tmp_path: Path) -> None:
    """In order, in one scratch folder: later examples use what earlier ones wrote (calibration, runs).

    `kvbench new-policy` writes into the scratch folder (``--dir``), never into the source tree, where a
    killed test would leave a new "built-in"; the template it wrote must then load as a policy."""
    from kvbench.registry import make_policy

    written: list[str] = []
    for _, command in [e for e in examples() if e[0] == doc]:
        args = shlex.split(command)
        if args[1] == "new-policy":
            args += ["--dir", str(tmp_path / "scorers")]
        result = subprocess.run(
            [KVBENCH, *args[1:]], capture_output=True, text=True, cwd=tmp_path, timeout=900
        )
        assert result.returncode == 0, f"{doc}: {command}\n{result.stderr}"
        written += re.findall(r"select it with --policy (\S+)$", result.stdout, flags=re.M)
    for spec in written:
        assert spec.startswith(str(tmp_path)) and make_policy(spec).name
