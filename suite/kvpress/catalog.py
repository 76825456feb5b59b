"""Which kvpress ScorerPresses kvbench can feed at a decode-time eviction event, and how.

A press's ``score(module, hidden_states, keys, values, attentions, kwargs)`` is fed from what the engine
holds at an event (kvbench.core.contract.EvictionView). A *feed* says how:

- ``cache``: the candidates' keys and values alone;
- ``window``: also the queries of the last W decoded tokens. The engine records them post-RoPE; the feed
  rotates them back to pre-RoPE (exact for plain RoPE) and hands them to the press as ``hidden_states``
  of a stand-in layer whose ``q_proj`` is the identity, with the matching ``position_embeddings`` and
  ``rotary_emb`` (kvbench.kvpress.feed);
- ``prerope_keys``: the candidates' own keys rotated back to pre-RoPE, as ``hidden_states`` of a stand-in
  layer whose ``k_proj`` is the identity;
- ``wrapped``: a press that wraps another (``press=SnapKVPress``, its parameters as ``press.window_size=32``)
  is fed as the press it wraps.

A press that also reads the layer's output projection (``module.o_proj.weight``) declares the engine's
``output_projection`` need: the HF backend gives the model's own W_O, vLLM cannot.

Every other press is listed with the reason it cannot run, so that ``kvbench list policies`` says it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Feed = Literal["cache", "window", "prerope_keys", "wrapped"]


@dataclass(frozen=True)
class Support:
    feed: Feed
    window: str | None = None
    """For the ``window`` feed: the press parameter that sets W (None: one query), and W = param + extra."""
    extra: int = 0
    output_projection: bool = False
    """The press reads ``module.o_proj.weight``."""


SUPPORTED: dict[str, Support] = {
    "KnormPress": Support("cache"),
    "StreamingLLMPress": Support("cache"),
    "RandomPress": Support("cache"),
    "KeyDiffPress": Support("cache"),
    "LagKVPress": Support("cache"),
    "CURPress": Support("cache"),
    "LeverageScorePress": Support("prerope_keys"),
    # SnapKV asserts more hidden states than its window: W = window_size + 1 queries
    "SnapKVPress": Support("window", window="window_size", extra=1),
    "TOVAPress": Support("window"),
    # the query statistics skip n_sink hidden states: W = n_sink + 64 recent queries
    "ExpectedAttentionPress": Support("window", window="n_sink", extra=64),
    "CapPress": Support("window", window="n_sink", extra=64),
    # rescales the wrapped press's scores by the L1 norm of W_O applied to each value
    "CriticalKVPress": Support("wrapped", output_projection=True),
}

WRAPPED = "press"
"""A wrapping press's parameter naming the press it wraps; ``press.NAME=VALUE`` sets that press's own."""

PREFILL_ONLY = (
    "scores every cached token by its own query (it asserts as many hidden states as keys: prefill "
    "only); at a decode-time event the engine holds queries of the last W tokens only"
)
UNSUPPORTED: dict[str, str] = {
    "NonCausalAttnPress": PREFILL_ONLY,
    "CompactorPress": PREFILL_ONLY,
    "ObservedAttentionPress": (
        "needs the full eager attention matrix of a prefill over every cached token; the engine records "
        "no attention of tokens decoded before the event"
    ),
    "QFilterPress": (
        "needs trained Q-filters downloaded from the Hugging Face hub for the model (nvidia/QFilter-*); "
        "kvbench runs offline: not supported until a local file can be given"
    ),
    "KVzapPress": (
        "needs a trained KVzap model from the Hugging Face hub (nvidia/KVzap-*) applied to the layer's "
        "hidden states; kvbench runs offline and records no hidden states"
    ),
    "PyramidKVPress": (
        "overrides compress() to keep a different number of tokens at each layer; kvbench's engine keeps "
        "K - B candidates at every layer, so its own scores would not be the press (use SnapKVPress)"
    ),
    "ExpectedAttentionStatsPress": (
        "loads precomputed query statistics from the Hugging Face hub (or a stats folder made from the "
        "model with kvpress); kvbench runs offline: use ExpectedAttentionPress, or kvbench's own "
        "calibrated policies"
    ),
}
"""The ScorerPresses of kvpress 0.5.5 that do not run, with the reason. A press found in an installed
kvpress that is in neither table is listed as not supported: not yet reviewed."""

ENGINE_SETS = ("compression_ratio",)
"""Press parameters the engine owns: the kept count K − B comes from the protocol's budget."""


def reason(name: str) -> str | None:
    """None when the press runs; otherwise why not."""
    if name in SUPPORTED:
        return None
    return UNSUPPORTED.get(name, "not reviewed for kvbench yet (a press newer than kvpress 0.5.5)")


def fed(name: str) -> str:
    """How a supported press is fed, as ``kvbench list policies`` says it."""
    support = SUPPORTED[name]
    text = f"as the press it wraps, {WRAPPED}=NAME" if support.feed == "wrapped" else support.feed
    return text + (" and the layer's W_O (hf adapter only)" if support.output_projection else "")


def wrappable() -> list[str]:
    """The presses a wrapping press may wrap: every supported press that wraps none itself."""
    return [name for name, support in SUPPORTED.items() if support.feed != "wrapped"]


def query_window(name: str, params: dict[str, object], defaults: dict[str, object]) -> int:
    """How many recent queries a ``window`` press reads (0 for the other feeds); a wrapping press is asked
    with the press it wraps."""
    support = SUPPORTED[name]
    if support.feed != "window":
        return 0
    if support.window is None:
        return 1 + support.extra
    value = params.get(support.window, defaults.get(support.window))
    return int(value) + support.extra  # type: ignore[call-overload]


PREFIX = "kvpress:"
"""``--policy kvpress:PressName[:key=value,...]`` selects a press by its kvpress class name."""


def policy_name(press: str) -> str:
    """The name a press's results carry: ``kvpress-`` and its class name in lower case without ``Press``
    (``kvpress-knorm``), within @policy's rule for names (kvbench.core.contract.POLICY_NAME), so that its
    runs can be exported and accepted like any entrant's."""
    return "kvpress-" + press.removesuffix("Press").lower()


def press_of(text: str) -> str | None:
    """The press class a ``--policy`` text selects (``kvpress:KnormPress...`` or a recorded name such as
    ``kvpress-knorm...``), or None when it selects no kvpress press."""
    if text.startswith(PREFIX):
        return text.split(":", 2)[1]
    head = text.split(":", 1)[0]
    return next((press for press in SUPPORTED if policy_name(press) == head), None)
