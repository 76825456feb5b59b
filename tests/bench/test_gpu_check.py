"""`make gpu-check DEVICE=cpu`: the GPU node's check at tiny shapes, so it cannot rot between GPU runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvbench.adapters.hf.models import load_model
from kvbench.bench.gpu_check import SCALES, kv_bytes_per_sequence
from kvbench.bench.parity import compare_traces, kept_trace
from kvbench.core.schedule import Schedule
from kvbench.registry import known_policies

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("gpu-check")
    venv = Path(sys.prefix)  # this interpreter's venv, taken as built (-o: make never rebuilds it here)
    command = [
        "make",
        "-o",
        f"{venv}/.installed",
        "gpu-check",
        "DEVICE=cpu",
        f"VENV={venv}",
        f"GPU_CHECK_OUT={out}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (found,) = out.glob("*.json")
    assert found.with_suffix(".md").read_text().startswith("# gpu-check on CPU")
    return json.loads(found.read_text())


@pytest.mark.slow
def test_the_cpu_run_passes_every_section(report: dict) -> None:
    assert report["ok"] and report["errors"] == {}
    assert report["imports"]["not_on_gpu_node"] == []
    assert "pydantic" in report["imports"]["kvbench_requirements_imported"]  # the wheels are needed
    evicting = {name for name, cls in known_policies().items() if cls.evicts}
    parity = {row["policy"]: row for row in report["parity"]["policies"]}
    assert set(parity) == evicting
    for row in parity.values():
        assert row["events"] > 0
        assert row["equal"] if not row["draws"] else row["seeded"], row
    assert parity["random"]["draws"] and parity["random"]["other_seed_other_kept"]
    assert not parity["snapkv"]["draws"]


@pytest.mark.slow
def test_every_policy_has_an_event_cost_beside_its_copy_floor(report: dict) -> None:
    cost = report["event_cost"]
    evicting = {name for name, cls in known_policies().items() if cls.evicts}
    for batch in SCALES["cpu"].evict_batches:
        rows = {r["policy"]: r for r in cost["rows"] if r["batch"] == batch}
        assert set(rows) == evicting
        for row in rows.values():
            assert row["ms_per_event"] > 0 and row["copy_floor_ms"] > 0
            # K slots of keys and values (fp32) and int64 positions, read and written, per layer
            slots = cost["layers"] * batch * cost["kv_heads"] * cost["budget"]
            assert row["bytes_moved"] == 2 * slots * (2 * cost["head_dim"] * 4 + 8)
        assert rows["random"]["ratio_to_random"] == 1.0
        assert rows["snapkv"]["paper_h200_ms"] == 0.37


@pytest.mark.slow
def test_decode_rows_name_their_regime_and_iso_memory_gives_random_more_rows(report: dict) -> None:
    decode = report["decode"]
    rows = {(r["batching"], r["policy"]): r for r in decode["rows"]}
    assert set(rows) == {(b, p) for b in ("fixed-batch", "iso-memory") for p in ("full", "random")}
    shapes = SCALES["cpu"]
    assert (
        rows["fixed-batch", "full"]["batch"]
        == rows["fixed-batch", "random"]["batch"]
        == shapes.decode_fixed_batch
    )
    assert not rows["fixed-batch", "full"]["memory_bound"]
    # iso-memory: each arm's batch is the memory over its own peak KV bytes per sequence
    need = decode["kv_bytes_per_sequence"]
    for policy in ("full", "random"):
        row = rows["iso-memory", policy]
        assert row["memory_bound"] and row["batch"] == shapes.decode_memory_cap // need[policy]
        assert row["tokens_per_second"] > 0
    assert rows["iso-memory", "random"]["batch"] > rows["iso-memory", "full"]["batch"]
    assert (
        rows["iso-memory", "random"]["eviction_events"] > 0
        and rows["iso-memory", "full"]["eviction_events"] == 0
    )
    assert report["flash_attention"]["ran"] is False and "skipped" in report["flash_attention"]["note"]


def test_kv_bytes_per_sequence_counts_the_event_s_two_copies() -> None:
    loaded = load_model("tiny-qwen3")
    shapes = SCALES["cpu"]
    need = kv_bytes_per_sequence(loaded.facts, torch.float32, shapes)
    token = 2 * 2 * 2 * 16 * 4  # 2 layers x 2 KV heads x keys and values x 16 channels x fp32
    assert need["full"] == (shapes.decode_prompt + shapes.decode_tokens) * token
    assert need["random"] == 2 * (shapes.decode_budget + shapes.decode_buffer) * token


def test_parity_detects_a_planted_mismatch() -> None:
    loaded = load_model("tiny-qwen3")
    tokens = torch.randint(
        0, len(loaded.tokenizer), (96,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    schedule = Schedule(budget=32, buffer=8)
    snapkv, drew = kept_trace(loaded, tokens, 16, "snapkv", schedule, (1, 2))
    assert not drew and len(snapkv) > 3
    assert compare_traces(snapkv, kept_trace(loaded, tokens, 16, "snapkv", schedule, (1, 2))[0]).equal
    planted = [t.clone() for t in snapkv]
    planted[2][1, 0, 1, -1] += 1  # event 2, layer 1: one kept position moved
    found = compare_traces(snapkv, planted)
    assert not found.equal and found.equal_events == len(snapkv) - 1
    assert found.first_mismatch == {"event": 2, "layer": 1}
    assert 0.9 < found.kept_agreement < 1.0
    other = compare_traces(snapkv, kept_trace(loaded, tokens, 16, "streaming", schedule, (1, 2))[0])
    assert not other.equal and other.first_mismatch is not None
    shorter = compare_traces(snapkv, snapkv[:-1])
    assert not shorter.equal and shorter.first_mismatch == {"event": len(snapkv) - 1, "layer": 0}
    _, drew = kept_trace(loaded, tokens, 16, "random", schedule, (1, 2))
    assert drew
