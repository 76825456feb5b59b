"""A results database built by the real runner: a budget sweep on the probes, a public and a private
reasoning task from hub-format fixtures, a value analysis and a decode benchmark, all on the seeded tiny
Qwen3."""

from __future__ import annotations

from pathlib import Path

import pytest
from built import built_once
from invoke import kvbench

HUB = Path(__file__).resolve().parents[1] / "fixtures" / "hub"
MIXED = Path(__file__).resolve().parents[1] / "fixtures" / "protocols" / "mixed-4bit-g8.yaml"

SWEEP = """
spec_version: 1
name: board-sweep
description: a small budget sweep for the leaderboard tests
models: [tiny-qwen3]
tasks: [passkey, fidelity]
policies: [streaming, snapkv]
protocol: protect-prompt
ratios: [2, 4]
limit: 3
"""


def _kvbench(*args: str, cwd: Path) -> None:
    done = kvbench(*args, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="session")
def board_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The snapshot of those runs: built once per test run, read by several files (read-only)."""
    return built_once(tmp_path_factory, "board", _build)


def _build(root: Path) -> Path:
    (root / "sweep.yaml").write_text(SWEEP)
    _kvbench("run", "--suite", "sweep.yaml", "--quiet", cwd=root)
    _kvbench("run", "--suite", "sweep.yaml", "--protocol", str(MIXED), "--ratio", "4", "--quiet", cwd=root)
    for task, data in (("gsm8k", "openai/gsm8k"), ("gpqa-diamond", "Idavidrein/gpqa")):
        _kvbench(
            *(
                "run",
                "--model",
                "tiny-qwen3",
                "--task",
                task,
                "--data",
                str(HUB / data),
                "--policy",
                "snapkv",
            ),
            *("--budget", "384", "--max-new-tokens", "16", "--limit", "2", "--samples", "1", "--quiet"),
            cwd=root,
        )
    _kvbench(
        *("analyze", "values", "--model", "tiny-qwen3", "--task", "fidelity"),
        *("--limit", "1", "--group", "16"),
        cwd=root,
    )
    _kvbench(
        *("bench", "decode", "--model", "tiny-qwen3", "--tokens", "200", "--budget", "128"),
        *("--policy", "random", "--policy", "snapkv", "--out", "runs"),
        *("--precision", str(MIXED)),
        cwd=root,
    )
    return root / "runs" / "kvbench.snapshot.duckdb"


@pytest.fixture(scope="session")
def one_ratio_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What a first user's runs look like: one compression ratio (the protocol's 4x), and a policy run at
    a smaller limit than the null beside it (h2o on 1 fidelity problem, snapkv and the null on 2)."""

    def build(root: Path) -> Path:
        run = ("run", "--model", "tiny-qwen3", "--task", "fidelity", "--samples", "1", "--quiet")
        _kvbench(*run, "--policy", "snapkv", "--limit", "2", cwd=root)
        _kvbench(*run, "--policy", "h2o", "--limit", "1", cwd=root)
        return root / "runs" / "kvbench.snapshot.duckdb"

    return built_once(tmp_path_factory, "one-ratio", build)
