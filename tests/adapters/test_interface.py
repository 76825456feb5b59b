"""The runner needs nothing of a backend but the adapter interface: `kvbench run` on the toy adapter
(tests/toy_adapter.py), in a process that never imports transformers or the hf adapter, and capabilities
refused once, before any model loads, with every reason named."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import duckdb

TESTS = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from kvbench.adapters.base import ADAPTERS
from toy_adapter import ToyAdapter
ADAPTERS.register("toy", ToyAdapter)
from kvbench.cli import main
code = main({argv!r})
heavy = sorted(m for m in sys.modules if m.startswith(("transformers", "kvbench.adapters.hf")))
print(json.dumps({{"code": code, "heavy": heavy}}))
"""


def kvbench_in_process(cwd: Path, *argv: str) -> tuple[dict, str]:
    script = SCRIPT.format(tests=str(TESTS), argv=list(argv))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=cwd, timeout=600
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout + done.stderr


def test_the_runner_runs_on_the_toy_adapter_alone(tmp_path: Path) -> None:
    args = ["run", "--adapter", "toy", "--attention", "toy", "--model", "tiny-qwen3", "--task", "fidelity"]
    result, output = kvbench_in_process(tmp_path, *args, "--policy", "h2o", "--limit", "3", "--quiet")
    assert result == {"code": 0, "heavy": []}, output
    con = duckdb.connect(str(tmp_path / "runs" / "kvbench.duckdb"), read_only=True)
    arms = con.execute(
        "SELECT r.policy, r.adapter, r.attention, count(*), avg(s.metric), min(s.evictions) "
        "FROM samples s JOIN runs r USING (run_id) GROUP BY ALL ORDER BY 1"
    ).fetchall()
    con.close()
    assert [(p, a, att, n) for p, a, att, n, _, _ in arms] == [
        ("full", "toy", "toy", 3),
        ("h2o", "toy", "toy", 3),
        ("random", "toy", "toy", 3),
    ]
    scores = {policy: (score, events) for policy, _, _, _, score, events in arms}
    assert scores["full"] == (1.0, 0)  # the full cache agrees with itself on every token
    assert scores["h2o"][1] > 0 and scores["h2o"][0] < 1.0 and scores["h2o"][0] != scores["random"][0]
    assert "fidelity on tiny-qwen3" in output and "h2o" in output


def test_capabilities_are_checked_once_before_any_model_loads(tmp_path: Path) -> None:
    args = ["run", "--adapter", "toy", "--model", "tiny-qwen3", "--task", "fidelity", "--device", "cuda"]
    args += ["--protocol", "mixed-4bit"]
    result, output = kvbench_in_process(tmp_path, *args, "--policy", "snapkv", "--quiet")
    assert result["code"] == 2 and not (tmp_path / "runs").exists()
    assert "device 'cuda': the toy adapter provides cpu" in output
    assert "attention 'sdpa': the toy adapter provides toy" in output
    assert "policy 'snapkv' needs queries, which the toy adapter lacks" in output
    assert "protocol 'mixed-4bit' keeps a mixed-precision cache, which the toy adapter cannot" in output


def test_an_unknown_adapter_is_named_with_the_known_ones(tmp_path: Path) -> None:
    result, output = kvbench_in_process(tmp_path, "run", "--adapter", "vlm", "--model", "tiny-qwen3")
    assert result["code"] == 2
    assert "unknown adapter 'vlm'. Did you mean 'vllm'? Known adapters: hf, toy, vllm." in output


def test_the_vllm_adapter_refuses_probes_and_names_its_venv(tmp_path: Path) -> None:
    probes = [
        "run",
        "--adapter",
        "vllm",
        "--model",
        "tiny-qwen3-d64",
        "--task",
        "passkey",
        "--policy",
        "snapkv",
    ]
    result, output = kvbench_in_process(tmp_path, *probes, "--quiet")
    assert result["code"] == 2 and not (tmp_path / "runs").exists()
    assert "task 'passkey' is a teacher-forced probe, which the vllm adapter cannot run" in output
    if importlib.util.find_spec("vllm") is None:  # the main venv: vLLM lives in its own
        gsm8k = Path(__file__).parents[1] / "fixtures" / "hub" / "openai" / "gsm8k"
        task = ["--task", "gsm8k", "--data", str(gsm8k), "--budget", "512", "--limit", "1"]
        result, output = kvbench_in_process(tmp_path, *probes[:5], *task, "--policy", "snapkv", "--quiet")
        assert result["code"] != 0
        assert "the vllm adapter needs vLLM 0.32.0, which is not installed" in output
        assert "make vllm-venv" in output
