"""The kvpress child: run under the kvpress environment's interpreter, never in kvbench's own process.

``python -m kvbench.kvpress.child list`` prints the ScorerPresses of the installed kvpress as JSON.
``python -m kvbench.kvpress.child serve PRESS`` answers the parent over kvbench.isolation.wire
(kvbench.isolation.serving): a hello with the press's parameters, then one ``score`` request per eviction
event of one layer, each answered with the press's scores [B, Hkv, n] in float32.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
from importlib.metadata import version
from typing import Any

import torch

from kvbench.isolation import messages, serving, wire
from kvbench.kvpress.catalog import ENGINE_SETS, SUPPORTED, WRAPPED, Feed, query_window, wrappable
from kvbench.kvpress.feed import score_arguments


def scorer_presses() -> dict[str, type]:
    """Every ScorerPress subclass that ``kvpress.presses`` exports, by class name."""
    import kvpress.presses as presses
    from kvpress.presses.scorer_press import ScorerPress

    found = {}
    for module in (presses, *(m for n, m in sys.modules.items() if n.startswith("kvpress.presses."))):
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, ScorerPress) and obj is not ScorerPress:
                found[name] = obj
    return dict(sorted(found.items()))


def _fields(cls: type) -> dict[str, Any]:
    """A press's init parameters and their defaults (JSON-able ones only): a dataclass press's fields, or
    the signature of a press that writes its own ``__init__`` (CriticalKVPress)."""
    if "__dataclass_fields__" in vars(cls):
        found = [
            (f.name, f.default if f.default is not dataclasses.MISSING else None)
            for f in dataclasses.fields(cls)
            if f.init
        ]
    else:
        found = [
            (p.name, None if p.default is inspect.Parameter.empty else p.default)
            for p in inspect.signature(cls).parameters.values()
        ]
    json_able = (bool, int, float, str, type(None))
    return {k: v if isinstance(v, json_able) else repr(v) for k, v in found if not k.startswith("_")}


def _typed(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    """``--policy`` text values turned into the types of the press's defaults; unknown names refused."""
    fields = _fields(cls)
    for name in ENGINE_SETS:
        if name in raw:
            raise ValueError(
                f"{name} is set by kvbench's engine (it keeps K - B candidates at each event, K from the "
                "protocol's budget); leave it out"
            )
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        shown = ", ".join(f"{k}={v}" for k, v in fields.items() if k not in ENGINE_SETS) or "none"
        raise ValueError(f"{cls.__name__} has no parameter {', '.join(unknown)}; its parameters: {shown}")
    typed: dict[str, Any] = {}
    for key, value in raw.items():
        default = fields[key]
        if isinstance(value, str) and isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{cls.__name__}.{key} is true or false, not {value!r}")
            typed[key] = value.lower() in ("true", "1")
        elif isinstance(value, str) and isinstance(default, (int, float)):
            typed[key] = type(default)(value)
        elif isinstance(value, str) and value.lower() == "none" and default is None:
            typed[key] = None
        elif isinstance(value, str) and default is None:
            typed[key] = int(value) if value.lstrip("-").isdigit() else float(value)
        else:
            typed[key] = value
    return typed


def _built(cls: type, raw: dict[str, Any]) -> tuple[Any, dict[str, Any], Feed, int]:
    """A press from its raw parameters: the press, its resolved parameters, its feed and query window."""
    support = SUPPORTED[cls.__name__]
    if support.feed == "wrapped":
        return _wrapping(cls, raw)
    params = _typed(cls, raw)
    resolved = {k: v for k, v in _fields(cls).items() if k not in ENGINE_SETS} | params
    return cls(**params), resolved, support.feed, query_window(cls.__name__, params, _fields(cls))


def _wrapping(cls: type, raw: dict[str, Any]) -> tuple[Any, dict[str, Any], Feed, int]:
    """A press that wraps another (``press=NAME``, the wrapped one's parameters as ``press.KEY=VALUE``),
    fed as the press it wraps."""
    name, prefix = raw.get(WRAPPED), f"{WRAPPED}."
    if name not in wrappable():
        raise ValueError(
            f"{cls.__name__} wraps another press: give {WRAPPED}=NAME, and that press's parameters as "
            f"{prefix}KEY=VALUE; NAME is one of {', '.join(wrappable())} (got {name!r})"
        )
    inner_raw = {k.removeprefix(prefix): v for k, v in raw.items() if k.startswith(prefix)}
    inner, inner_resolved, feed, window = _built(scorer_presses()[name], inner_raw)
    params = _typed(cls, {k: v for k, v in raw.items() if k != WRAPPED and not k.startswith(prefix)})
    own = {k: v for k, v in _fields(cls).items() if k != WRAPPED and k not in ENGINE_SETS} | params
    resolved = {WRAPPED: name, **{prefix + k: v for k, v in inner_resolved.items()}, **own}
    return cls(inner, **params), resolved, feed, window


def _hello(press_name: str, raw: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    presses = scorer_presses()
    if press_name not in presses:
        raise ValueError(f"kvpress {version('kvpress')} has no ScorerPress {press_name!r}")
    cls = presses[press_name]
    press, resolved, feed, window = _built(cls, raw)
    return press, {
        "ok": True,
        "press": press_name,
        "params": resolved,
        "kvpress_version": version("kvpress"),
        "transformers_version": version("transformers"),
        "feed": feed,
        "query_window": window,
        "module": cls.__module__,
        "summary": inspect.getdoc(cls) or "",
    }


def score(press: Any, feed: Feed, header: dict[str, Any], tensors: dict[str, Any]) -> torch.Tensor:
    """The press's scores at one event. Presses that draw from torch's global generator (RandomPress
    without a seed, CURPress's and LeverageScorePress's sketches) draw from the first row's event seed,
    so that a rerun is identical."""
    from kvpress.presses.decoding_press import DecodingPress

    view = messages.eviction_view(header, tensors)
    # A press may read its compression_ratio inside score (StreamingLLMPress does): set it, as kvpress's
    # own DecodingPress does at each compression, to the ratio that keeps exactly K - B of the n candidates.
    ratio = DecodingPress._find_target_compression_ratio(None, view.num_candidates, view.keep)
    press.compression_ratio = ratio
    torch.manual_seed(int(header["seeds"][0]))
    arguments = score_arguments(view, feed)
    with torch.no_grad():
        scores = press.score(**arguments)
    return scores.float()


def serve(press_name: str) -> None:
    press: Any = None
    feed: Feed = "cache"
    # the parent sends a layer's W_O with its first event only (kvbench.kvpress.policy): kept here
    output_projections: dict[tuple[str, int], torch.Tensor] = {}

    def hello(header: dict[str, Any]) -> dict[str, Any]:
        nonlocal press, feed
        press, greeting = _hello(press_name, header.get("params", {}))
        feed = greeting["feed"]
        return greeting

    def answer(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> wire.Frame:
        layer = (str(header["model"]["name"]), int(header["layer"]))
        if "output_projection" in tensors:  # a copy: the arena's file holds the next request's tensors
            output_projections[layer] = tensors["output_projection"].clone()
        elif layer in output_projections:
            tensors = {**tensors, "output_projection": output_projections[layer]}
        return {"ok": True}, {"scores": score(press, feed, header, tensors)}

    serving.serve(hello, answer)


def listing() -> None:
    print(json.dumps({"kvpress_version": version("kvpress"), "presses": list(scorer_presses())}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["list"]:
        listing()
    else:
        serve(sys.argv[2])
