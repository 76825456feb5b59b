"""The contract's views as messages (a JSON header and named tensors), and back.

An isolated scorer receives exactly what an in-process one reads at an event: the candidates' keys,
values, positions and protection, the recent queries and calibration it declared, the model's facts,
its own layer state and the seeds of its per-row generators. It returns scores and its layer state.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

import torch
from torch import Tensor

from kvbench.core.calibration import QueryStats
from kvbench.core.contract import EvictionView, LayerState, ModelFacts, StepView
from kvbench.isolation.wire import Frame as Message

REPLY_SLACK_BYTES = 1 << 20
"""Room in every reply's payload past what its request accounts for (alignment, small tensors); all a
reply to a request with no tensors (a hello, a drop) may carry."""

EVENT_SCALARS = ("layer", "event", "step", "prompt_len", "budget", "keep")  # an EvictionView's integers


_TENSOR_FACTS = ("rope_inv_freq", "output_projections")  # sent as tensors (RoPE) or with the view (W_O)


def _model(model: ModelFacts) -> Message:
    # the fields one by one: asdict would deep-copy every layer's output weights at every request
    facts = {f.name: getattr(model, f.name) for f in fields(model) if f.name not in _TENSOR_FACTS}
    has_rope = model.rope_inv_freq is not None
    return {"model": facts, "rope": has_rope}, (
        {"model.rope_inv_freq": model.rope_inv_freq} if has_rope else {}
    )


def _model_facts(header: dict[str, Any], tensors: dict[str, Tensor]) -> ModelFacts:
    return ModelFacts(**header["model"], rope_inv_freq=tensors.get("model.rope_inv_freq"))  # type: ignore[arg-type]


def _state(state: LayerState) -> Message:
    return {"fills": state.fills()}, {f"state.{k}": v for k, v in state.tensors().items()}


def layer_state(header: dict[str, Any], tensors: dict[str, Tensor]) -> LayerState:
    state = LayerState()
    state.replace(
        {k[len("state.") :]: v for k, v in tensors.items() if k.startswith("state.")}, header["fills"]
    )
    return state


def eviction_request(view: EvictionView) -> Message:
    head, tensors = _model(view.model)
    state_head, state = _state(view.state)
    head |= state_head | {"op": "score", **{k: getattr(view, k) for k in EVENT_SCALARS}}
    head["seeds"] = [g.initial_seed() for g in view.rngs]  # fresh generators: the seed is the whole state
    tensors |= state | {"keys": view.keys, "values": view.values}
    tensors |= {"positions": view.positions, "protected": view.protected}
    if view.recent_queries is not None:
        tensors["queries"] = view.recent_queries
    if view.output_projection is not None:
        tensors["output_projection"] = view.output_projection
    if isinstance(view.calibration, QueryStats):
        stats = view.calibration
        head["calibration"] = {"model": stats.model, "corpus": stats.corpus, "tokens": stats.tokens}
        tensors |= {"calibration.mean_real": stats.mean.real, "calibration.mean_imag": stats.mean.imag}
        tensors["calibration.mean_abs"] = stats.mean_abs
    return head, tensors


ON_REQUEST = ("keys", "values", "positions", "protected", "queries")
"""The view's tensors an isolated scorer may leave unread: after its first event the parent sends those it
has read, and the others only when it reads them (kvbench.isolation.serving's Arrivals)."""

_FIELDS = ("keys", "values", "positions", "protected")  # the required ones; recent_queries defaults to None


def _arriving(field: str, name: str) -> property:
    def read(view: ArrivingView) -> Any:
        held = vars(view)
        if field not in held:
            held[field] = held["_arrivals"].get(name)
            held["_read"].add(name)
        return held[field]

    return property(read, lambda view, value: None)  # the dataclass's __init__ sets it: read from arrivals


class ArrivingView(EvictionView):
    """An isolated scorer's view: each large tensor is taken from the request when first read (the parent
    may have held it back, and sends it then), and the names read go back with the reply."""

    keys = _arriving("keys", "keys")
    values = _arriving("values", "values")
    positions = _arriving("positions", "positions")
    protected = _arriving("protected", "protected")
    recent_queries = _arriving("recent_queries", "queries")

    def tensors_read(self) -> list[str]:
        return sorted(vars(self)["_read"])


def eviction_view(header: dict[str, Any], tensors: dict[str, Tensor]) -> ArrivingView:
    calibration = None
    if header.get("calibration") is not None:
        mean = torch.complex(tensors["calibration.mean_real"], tensors["calibration.mean_imag"])
        calibration = QueryStats(**header["calibration"], mean=mean, mean_abs=tensors["calibration.mean_abs"])
    arriving: dict[str, Any] = dict.fromkeys(_FIELDS)  # read from the arrivals, when first read
    scalars: dict[str, Any] = {k: int(header[k]) for k in EVENT_SCALARS}
    view = ArrivingView(
        **arriving,
        **scalars,
        model=_model_facts(header, tensors),
        state=layer_state(header, tensors),
        rngs=tuple(torch.Generator().manual_seed(int(seed)) for seed in header["seeds"]),
        calibration=calibration,
        output_projection=tensors.get("output_projection"),
    )
    vars(view).update(_arrivals=tensors, _read=set())
    return view


def step_request(step: StepView) -> Message:
    head, tensors = _model(step.model)
    state_head, state = _state(step.state)
    head |= state_head | {"op": "observe", "layer": step.layer, "step": step.step}
    return head, tensors | state | {"attention": step.attention, "positions": step.positions}


def step_view(header: dict[str, Any], tensors: dict[str, Tensor]) -> StepView:
    return StepView(
        attention=tensors["attention"],
        positions=tensors["positions"],
        layer=int(header["layer"]),
        step=int(header["step"]),
        model=_model_facts(header, tensors),
        state=layer_state(header, tensors),
    )


def state_reply(state: LayerState, scores: Tensor | None = None, read: list[str] | None = None) -> Message:
    head, tensors = _state(state)
    head |= {"read": read} if read is not None else {}
    return {"ok": True, **head}, tensors | ({"scores": scores} if scores is not None else {})


def reply_room(tensors: dict[str, Tensor], scores: tuple[int, ...] | None = None) -> int:
    """The most payload bytes a reply to a request carrying ``tensors`` can legitimately hold, known
    before the reply arrives: scores of shape ``scores`` ([B, Hkv, n]) as float64, the layer state back at
    up to twice the size it was sent at, a new state tensor as large as the request's largest, and
    REPLY_SLACK_BYTES. The host allocates no more than this for a reply, whatever its frame announces."""
    sizes = {name: t.numel() * t.element_size() for name, t in tensors.items()}
    state = sum(size for name, size in sizes.items() if name.startswith("state."))
    score_bytes = 8 * math.prod(scores) if scores is not None else 0
    return score_bytes + 2 * state + max(sizes.values(), default=0) + REPLY_SLACK_BYTES
