"""kvbench check: passes on its own reference, fails on a scorer broken after the reference was written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from invoke import kvbench

from kvbench.provenance import provenance
from kvbench.registry import builtin_policies

REPO = Path(__file__).resolve().parents[2]

SCORER = '''
from kvbench.core.contract import EvictionView, Policy, policy


@policy("my-recency")
class MyRecency(Policy):
    """Keeps the most recent candidates."""

    def score(self, view: EvictionView):
        return {sign}view.positions.float()
'''

SUITE = """
spec_version: 1
name: check-test
description: one user scorer on the fidelity probe, tiny model
models: [tiny-qwen3]
tasks: [fidelity]
policies: [{policy}]
protocol: protect-prompt
limit: 4
"""


def test_check_passes_on_the_reference_and_fails_on_a_broken_scorer(tmp_path: Path) -> None:
    scorer = tmp_path / "my_scorer.py"
    scorer.write_text(SCORER.format(sign=""))
    suite = tmp_path / "check-test.yaml"
    suite.write_text(SUITE.format(policy=f"{scorer}:MyRecency"))
    missing = kvbench("check", "--suite", str(suite), "--quiet", cwd=tmp_path)
    assert missing.returncode == 2 and "--update-reference" in missing.stderr

    written = kvbench("check", "--suite", str(suite), "--update-reference", "--quiet", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    reference = json.loads((tmp_path / "runs" / "reference" / "check-test.json").read_text())
    assert {c["key"].split("{")[0] for c in reference["cells"]} == {
        "tiny-qwen3/fidelity/protect-prompt/my-recency",
        "tiny-qwen3/fidelity/protect-prompt/random",
        "tiny-qwen3/fidelity/protect-prompt/full",
    }
    assert {"suite_sha256", "packages", "hardware", "git", "written"} <= set(reference["manifest"])

    again = kvbench("check", "--suite", str(suite), "--quiet", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "3 of 3 cells unchanged; 0 failing" in again.stdout

    scorer.write_text(SCORER.format(sign="-"))  # evicts the most recent candidates first
    broken = kvbench("check", "--suite", str(suite), "--quiet", cwd=tmp_path)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "regressed" in broken.stdout and "my-recency" in broken.stdout
    assert "2 of 3 cells unchanged; 1 failing (regressed)" in broken.stdout


def test_changed_outputs_specs_or_suites_fail(tmp_path: Path) -> None:
    scorer = tmp_path / "my_scorer.py"
    scorer.write_text(SCORER.format(sign=""))
    suite = tmp_path / "check-test.yaml"
    suite.write_text(SUITE.format(policy=f"{scorer}:MyRecency"))
    assert (
        kvbench("check", "--suite", str(suite), "--update-reference", "--quiet", cwd=tmp_path).returncode == 0
    )
    path = tmp_path / "runs" / "reference" / "check-test.json"
    reference = json.loads(path.read_text())
    for cell in reference["cells"]:  # as if the engine had produced other outputs for the same code
        cell["outputs"] = "0" * 16
    reference["cells"][0]["identity"] = "f" * 16  # and as if one cell's spec had changed
    path.write_text(json.dumps(reference))
    result = kvbench("check", "--suite", str(suite), "--quiet", cwd=tmp_path)
    assert result.returncode == 1
    assert "0 of 3 cells unchanged; 3 failing (changed, code unchanged, spec changed)" in result.stdout
    suite.write_text(SUITE.format(policy=f"{scorer}:MyRecency").replace("limit: 4", "limit: 1"))
    smaller = kvbench("check", "--suite", str(suite), "--quiet", cwd=tmp_path)
    assert smaller.returncode == 1 and "changed since its reference" in smaller.stdout


def test_the_committed_ci_reference_covers_every_built_in_policy() -> None:
    reference = json.loads((REPO / "runs" / "reference" / "ci.json").read_text())
    policies = {cell["key"].split("/")[3].split("{")[0] for cell in reference["cells"]}
    assert policies == {ref.cls.name for ref in builtin_policies().values()}
    models = {cell["key"].split("/")[0] for cell in reference["cells"]}
    assert models == {"tiny-qwen3", "smollm2-135m"}
    assert reference["manifest"]["suite"] == "ci" and reference["manifest"]["packages"]["torch"]


@pytest.mark.slow
def test_the_ci_gate_passes_every_builtin_policy_against_the_committed_reference(tmp_path: Path) -> None:
    """The policy-regression gate itself (`make check`: `kvbench check --suite ci`), run where the tests
    run so that CI spreads it over the cores with them: every cell of runs/reference/ci.json recomputed
    from scratch, none failing, and every one unchanged to the bit on a CPU of the reference's kind. On
    another kind (an AVX2-only AMD against the reference's AMX Xeon) float kernels round otherwise: a
    cell may then change within its tolerance, which the gate reports without failing."""
    reference = json.loads((REPO / "runs" / "reference" / "ci.json").read_text())
    cells = len(reference["cells"])
    suite = yaml.safe_load((REPO / "suite" / "suites" / "ci.yaml").read_text())
    assert cells == len(suite["models"]) * (len(suite["policies"]) + 2)  # with the null and the full cache
    done = kvbench(
        "check", "--suite", "ci", "--reference", str(REPO / "runs" / "reference"), "--quiet", cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    recorded = reference["manifest"]["hardware"]
    here = provenance("cpu")["hardware"]
    if (here["cpu"], here["cpu_vector_features"]) == (recorded["cpu"], recorded["cpu_vector_features"]):
        assert f"{cells} of {cells} cells unchanged; 0 failing" in done.stdout
    else:
        assert re.search(rf"\b\d+ of {cells} cells unchanged; 0 failing", done.stdout), done.stdout[-3000:]
