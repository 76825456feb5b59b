"""Parity: at one eviction event, the positions kvbench's engine keeps with a kvpress press scoring equal
the positions the press's own ``compress()`` keeps at the same kept count, with nothing protected.

kvpress's side (press_side.py, under the kvpress venv) runs a real transformers Qwen3 layer and calls
``compress()`` with the real module, hidden states and position embeddings. kvbench's side sees only what
the engine holds at an event (cached keys and values, recorded post-RoPE queries, RoPE frequencies) and
goes through the whole path a run takes: Evictor -> KvpressPolicy -> the child process -> the stand-in
layer (kvbench.kvpress.feed) -> press.score, then the engine's own top-k.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from kvpress_support import kvpress_python, run_press_side
from safetensors.torch import load_file

from kvbench.core.contract import ModelFacts, policy_name_problem
from kvbench.core.engine import Evictor
from kvbench.core.layer_kv import LayerKV
from kvbench.core.schedule import Schedule
from kvbench.core.seeding import eviction_seed
from kvbench.errors import SpecError
from kvbench.kvpress.catalog import SUPPORTED
from kvbench.kvpress.policy import kvpress_policy

TOKENS, KEEP, ROW_SEED = 96, 40, 0
PRESSES = [
    "KnormPress",
    "StreamingLLMPress",
    "RandomPress:seed=3",
    "RandomPress",
    "KeyDiffPress",
    "LagKVPress:lag_size=16",
    "CURPress",
    "LeverageScorePress",
    "SnapKVPress:window_size=16",
    "TOVAPress",
    "ExpectedAttentionPress",
    "CapPress",
    "CriticalKVPress:press=KnormPress",
    "CriticalKVPress:press=SnapKVPress,press.window_size=16,first_stage_ratio=0.25",
]


@pytest.fixture(scope="module")
def press_side(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, torch.Tensor], dict]:
    kvpress_python()
    folder = tmp_path_factory.mktemp("press-side")
    tensors, kept = folder / "event.safetensors", folder / "kept.json"
    layer = 1
    run_press_side("press_side.py", tensors, kept, TOKENS, KEEP, eviction_seed(ROW_SEED, layer, 0), *PRESSES)
    return load_file(str(tensors)), json.loads(kept.read_text())


def kvbench_kept(text: str, event: dict[str, torch.Tensor], layer: int) -> list[list[int]]:
    """The positions kvbench's engine keeps at layer ``layer``'s first event, the press scoring."""
    keys, values, queries = event["keys"], event["values"], event["queries"]
    batch, heads, tokens, dim = keys.shape
    projections = (event["output_projection"],) * 2
    model = ModelFacts("tiny-qwen3", 2, queries.shape[1], heads, dim, event["inv_freq"], projections)
    policy = kvpress_policy(f"kvpress:{text}")
    try:
        # one buffer slot after the T candidates (never a candidate); the event happens at step T
        pad = torch.zeros(batch, heads, 1, dim)
        positions = torch.arange(tokens + 1).expand(batch, heads, -1).contiguous()
        layer_kv = (torch.cat([keys, pad], 2), torch.cat([values, pad], 2), positions)
        layers = [LayerKV(*layer_kv) for _ in range(2)]
        window = policy.query_window
        recent = [queries[:, :, -window:] if window else None] * 2
        evictor = Evictor(
            policy, Schedule(budget=KEEP + 1, buffer=1, protection="none"), model,
            prompt_len=0, row_seeds=[ROW_SEED],
        )  # fmt: skip
        kept = evictor.evict(layers, step=tokens, queries=recent if window else None)
    finally:
        policy.close()
    return kept[layer].positions[0, :, :KEEP].sort(-1).values.tolist()


def test_the_supported_list_is_what_the_parity_test_covers() -> None:
    assert {text.split(":")[0] for text in PRESSES} == set(SUPPORTED)
    assert len(SUPPORTED) >= 12


@pytest.mark.slow
@pytest.mark.parametrize("text", PRESSES)
def test_kept_positions_equal_compress(text: str, press_side: tuple[dict[str, torch.Tensor], dict]) -> None:
    event, expected = press_side
    kept = kvbench_kept(text, event, expected["layer"])
    assert kept == expected["kept"][text]
    assert "kvpress" not in sys.modules  # kvbench's process never imported it


def test_a_press_that_cannot_run_says_why() -> None:
    kvpress_python()
    with pytest.raises(SpecError, match="QFilterPress: kvbench cannot run this press: needs trained Q-filt"):
        kvpress_policy("kvpress:QFilterPress")
    with pytest.raises(SpecError, match=r"kvpress 0\.5\.5 has no ScorerPress 'NoSuchPress'"):
        kvpress_policy("kvpress:NoSuchPress")


def test_bad_parameters_are_refused_by_name() -> None:
    kvpress_python()
    with pytest.raises(SpecError, match=r"no parameter windw; its parameters: .*window_size=64"):
        kvpress_policy("kvpress:SnapKVPress:windw=3")
    with pytest.raises(SpecError, match="compression_ratio is set by kvbench's engine"):
        kvpress_policy("kvpress:KnormPress:compression_ratio=0.5")


def test_a_recorded_identity_rebuilds_the_press_only_under_its_kvpress_version() -> None:
    kvpress_python()
    first = kvpress_policy("kvpress:SnapKVPress:window_size=32")
    first.close()
    assert first.name == "kvpress-snapkv" and policy_name_problem(first.name) is None
    params = ",".join(f"{k}={v}" for k, v in first.params().items())
    again = kvpress_policy(f"{first.name}:{params}")  # its recorded name and parameters
    try:
        assert (
            again.params()
            == first.params()
            == {"window_size": 32, "kernel_size": 5, "kvpress_version": "0.5.5"}
        )
    finally:
        again.close()
    with pytest.raises(SpecError, match=r"recorded with kvpress 0\.4\.0, but the kvpress venv has 0\.5\.5"):
        kvpress_policy("kvpress:KnormPress:kvpress_version=0.4.0")
