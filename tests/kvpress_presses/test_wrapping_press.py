"""CriticalKVPress: a press that wraps another and reads the layer's output projection W_O.

Its parity with kvpress's own ``compress()`` is in test_parity.py; here, what that single event does not
show: W_O crosses to the child once per layer and the scores at later events still use the right layer's
W_O (checked against CriticalKV's formula computed here, without kvpress), the wrapped press's parameters
are recorded and rebuilt, a missing or unwrappable press is named, and vLLM, which cannot give W_O, is
refused before any model loads.
"""

from __future__ import annotations

import pytest
import torch
from invoke import kvbench
from kvpress_support import kvpress_python

from kvbench.core.contract import EvictionView, LayerState, ModelFacts
from kvbench.errors import SpecError
from kvbench.kvpress.policy import kvpress_policy

HKV, HQ, D, HIDDEN, N, KEEP = 2, 4, 16, 320, 30, 12  # W_O over 64 KiB: it crosses in the arena


def view(model: ModelFacts, layer: int, event: int, seed: int) -> EvictionView:
    g = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(1, HKV, N, D, generator=g), torch.randn(1, HKV, N, D, generator=g)
    positions = torch.arange(N).expand(1, HKV, N).contiguous()
    return EvictionView(
        keys=keys, values=values, positions=positions, protected=torch.zeros(1, HKV, N, dtype=torch.bool),
        layer=layer, event=event, step=N + 4, prompt_len=0, budget=KEEP + 4, keep=KEEP, model=model,
        state=LayerState(), rngs=(torch.Generator().manual_seed(0),),
        output_projection=model.output_projections[layer] if model.output_projections else None,
    )  # fmt: skip


def critical_knorm(v: EvictionView, first_stage_ratio: float = 0.5, epsilon: float = 1e-4) -> torch.Tensor:
    """CriticalKV over Knorm (arXiv 2502.03805, as kvpress 0.5.5 writes it), from the view alone."""
    scores = -v.keys.norm(dim=-1)
    selected = scores.topk(int(v.keep * first_stage_ratio), dim=-1).indices
    w_o = v.output_projection.T.reshape(HQ, D, HIDDEN)  # per query head: D -> hidden
    values = v.values.repeat_interleave(HQ // HKV, dim=1)  # [1, HQ, N, D]
    projected = torch.einsum("bhnd,hdo->bhno", values, w_o).abs().sum(-1)
    projected = projected.view(1, HKV, HQ // HKV, N).mean(2)
    return ((scores + epsilon) * projected).scatter(-1, selected, torch.finfo(torch.float32).max)


def test_each_layers_output_weights_cross_once_and_score_every_later_event() -> None:
    kvpress_python()
    g = torch.Generator().manual_seed(7)
    weights = tuple(torch.randn(HIDDEN, HQ * D, generator=g) for _ in range(2))
    model = ModelFacts("toy", 2, HQ, HKV, D, torch.ones(D // 2), weights)
    policy = kvpress_policy("kvpress:CriticalKVPress:press=KnormPress")
    try:
        assert policy.needs == {"output_projection"}
        # layer 0, layer 1, then layer 0 again: the last request carries no W_O, the child's copy serves
        for layer, event, seed in [(0, 0, 1), (1, 0, 2), (0, 1, 3), (1, 1, 4)]:
            v = view(model, layer, event, seed)
            torch.testing.assert_close(policy.score(v), critical_knorm(v), rtol=1e-5, atol=1e-5)
        assert policy.sent_output_projections == {("toy", 0), ("toy", 1)}
    finally:
        policy.close()


def test_the_wrapped_press_and_its_parameters_are_recorded_and_rebuilt() -> None:
    kvpress_python()
    first = kvpress_policy("kvpress:CriticalKVPress:press=SnapKVPress,press.window_size=16,epsilon=0.001")
    first.close()
    expected = {
        "press": "SnapKVPress",
        "press.window_size": 16,
        "press.kernel_size": 5,
        "epsilon": 0.001,
        "first_stage_ratio": 0.5,
        "kvpress_version": "0.5.5",
    }
    assert first.params() == expected
    assert first.name == "kvpress-criticalkv" and first.query_window == 17
    assert first.needs == {"queries", "rope", "output_projection"}
    again = kvpress_policy(f"{first.name}:" + ",".join(f"{k}={v}" for k, v in expected.items()))
    again.close()
    assert again.params() == expected


def test_a_missing_or_unwrappable_press_is_named() -> None:
    kvpress_python()
    with pytest.raises(SpecError, match=r"CriticalKVPress wraps another press: give press=NAME.*KnormPress"):
        kvpress_policy("kvpress:CriticalKVPress")
    with pytest.raises(SpecError, match=r"\(got 'CriticalKVPress'\)"):
        kvpress_policy("kvpress:CriticalKVPress:press=CriticalKVPress")
    with pytest.raises(SpecError, match=r"SnapKVPress has no parameter windw"):
        kvpress_policy("kvpress:CriticalKVPress:press=SnapKVPress,press.windw=3")


def test_vllm_which_cannot_give_the_output_weights_is_refused_before_loading(tmp_path) -> None:
    kvpress_python()
    args = ["run", "--adapter", "vllm", "--model", "tiny-qwen3-d64", "--task", "passkey"]
    done = kvbench(*args, "--policy", "kvpress:CriticalKVPress:press=KnormPress", "--quiet", cwd=tmp_path)
    assert done.returncode == 2 and not (tmp_path / "runs").exists()
    assert "policy 'kvpress-criticalkv' needs output_projection, which the vllm adapter lacks" in (
        done.stdout + done.stderr
    )
