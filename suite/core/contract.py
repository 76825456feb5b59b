"""The policy contract: a policy scores eviction candidates; the engine does everything else.

A policy is a frozen dataclass (its fields are its parameters, recorded with every result) with one
method, ``score(view) -> Tensor[B, Hkv, n]`` (higher = keep), and optionally ``observe(step)`` for
policies that must see every decode step. Budgets, protection, top-k and compaction belong to the engine
(kvbench.core.engine), so that a policy and the null baseline are always compared under the same schedule.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeGuard, TypeVar, cast, get_args

import pydantic
import torch
from torch import Tensor

Need = Literal["queries", "step_attention", "rope", "calibration", "output_projection"]
"""What a policy may ask the backend for.

- ``queries``: the last W post-RoPE queries of the layer, ``view.queries`` [B, Hq, W, D].
- ``step_attention``: ``observe(step)`` with the new queries' attention probabilities over the cache.
- ``rope``: the model's RoPE frequencies (``view.model.rope_inv_freq``) to un-rotate keys.
- ``calibration``: per-model statistics made by ``kvbench calibrate``.
- ``output_projection``: the layer's attention output weights W_O, ``view.output_projection``
  [hidden, Hq·D] (``o_proj.weight``), for scores that weigh a value by what it adds to the output.
"""
NEEDS: tuple[Need, ...] = get_args(Need)

POLICY_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")
"""What ``@policy(name)`` accepts, matched whole. A name is printed in terminals, tables and the
leaderboard, and names a bundle's scorer member (``scorers/NAME.py``): no control character, markup,
quote, space or path separator can be in one. No ``.`` either: ``--policy x.py`` reads as a file."""
POLICY_NAME_RULE = "a lower-case letter, then at most 63 lower-case letters, digits, '-' or '_'"


def policy_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a policy (a sentence with the name, the rule and a valid example), or None."""
    if isinstance(name, str) and POLICY_NAME.fullmatch(name):
        return None
    # repr shows a control character as its escape; a long name is cut, not printed whole
    shown = repr(name) if not isinstance(name, str) or len(name) <= 80 else f"{name[:80]!r}…"
    return f"policy name {shown} is not allowed: a name is {POLICY_NAME_RULE} (e.g. 'my-scorer_2')"


@dataclass(frozen=True)
class ModelFacts:
    """What a policy may know about the model it runs in."""

    name: str
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    rope_inv_freq: Tensor
    """[D/2] angular frequency ω_f of each RoPE band, rotate-half layout (pairs f and f + D/2)."""
    output_projections: tuple[Tensor, ...] | None = None
    """Per layer, the attention output weights W_O [hidden, Hq·D] (the model's own tensors, not copies),
    where the backend can give them; a view carries its layer's only to a policy that needs them."""

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.num_q_heads // self.num_kv_heads


class LayerState:
    """Per-layer, per-batch policy state, owned by the engine.

    Two kinds of tensors live here:
    - slot tensors ``[B, Hkv, S, ...]`` aligned with the cache's S slots: the engine appends ``fill`` for
      every new token, gathers them with the keys at every eviction, and drops rows that leave the batch;
    - row tensors ``[B, ...]`` (a per-row projection, say): the engine only drops rows that leave.
    """

    def __init__(self) -> None:
        self._slots: dict[str, Tensor] = {}
        self._fills: dict[str, float] = {}
        self._rows: dict[str, Tensor] = {}

    # -- used by policies -------------------------------------------------------------------------
    def has_slot(self, name: str) -> bool:
        return name in self._slots

    def register_slot(self, name: str, tensor: Tensor, fill: float = 0.0) -> None:
        """Start tracking ``tensor`` [B, Hkv, S, ...] slot by slot; new slots get ``fill``."""
        self._slots[name] = tensor
        self._fills[name] = fill

    def slot(self, name: str) -> Tensor:
        return self._slots[name]

    def set_slot(self, name: str, tensor: Tensor) -> None:
        """Replace a registered slot tensor by one of the same shape."""
        old = self._slots[name]
        if tensor.shape != old.shape:
            raise ValueError(f"slot state {name!r}: shape {tuple(tensor.shape)} != {tuple(old.shape)}")
        self._slots[name] = tensor

    def has_row(self, name: str) -> bool:
        return name in self._rows

    def row(self, name: str) -> Tensor:
        return self._rows[name]

    def set_row(self, name: str, tensor: Tensor) -> None:
        self._rows[name] = tensor

    # -- used by the engine -----------------------------------------------------------------------
    def append_slots(self, count: int) -> None:
        """``count`` tokens were appended to the cache: extend every slot tensor with its fill value."""
        for name, tensor in self._slots.items():
            pad_shape = (*tensor.shape[:2], count, *tensor.shape[3:])
            pad = torch.full(pad_shape, self._fills[name], dtype=tensor.dtype, device=tensor.device)
            self._slots[name] = torch.cat([tensor, pad], dim=2)

    def gathered(self, index: Tensor) -> LayerState:
        """A new state whose slot tensors keep the slots ``index`` [B, Hkv, S'] in that order."""
        new = LayerState()
        new._fills = dict(self._fills)
        new._rows = dict(self._rows)
        for name, tensor in self._slots.items():
            idx = index.view(*index.shape, *([1] * (tensor.dim() - 3))).expand(
                *index.shape, *tensor.shape[3:]
            )
            new._slots[name] = torch.gather(tensor, 2, idx)
        return new

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor by a prefixed name (``slot.`` or ``row.``), with :meth:`fills`: the whole state, as
        an isolated scorer's process receives and returns it (kvbench.isolation)."""
        return {
            **{f"slot.{k}": v for k, v in self._slots.items()},
            **{f"row.{k}": v for k, v in self._rows.items()},
        }

    def fills(self) -> dict[str, float]:
        return dict(self._fills)

    def replace(self, tensors: dict[str, Tensor], fills: dict[str, float]) -> None:
        """Take the whole state from :meth:`tensors` and :meth:`fills` of another state."""
        self._slots = {k[len("slot.") :]: v for k, v in tensors.items() if k.startswith("slot.")}
        self._rows = {k[len("row.") :]: v for k, v in tensors.items() if k.startswith("row.")}
        self._fills = {k: float(fills.get(k, 0.0)) for k in self._slots}

    def select_rows(self, rows: Tensor) -> None:
        """Keep only batch rows ``rows`` (1-D index), e.g. when other rows finished."""
        self._slots = {k: v.index_select(0, rows) for k, v in self._slots.items()}
        self._rows = {k: v.index_select(0, rows) for k, v in self._rows.items()}


@dataclass(frozen=True)
class EvictionView:
    """What a policy sees at one eviction event of one layer. Read-only: never modify these tensors. They
    hold during the call only (the engine compacts the cache in place after it; an isolated scorer's
    are mapped from a file the next request overwrites): copy what a policy keeps, or keep it in
    ``state``."""

    keys: Tensor
    """[B, Hkv, n, D] candidate keys, post-RoPE, as cached (every slot but the buffer)."""
    values: Tensor
    """[B, Hkv, n, D] candidate values."""
    positions: Tensor
    """[B, Hkv, n] absolute token positions of the candidates (int64)."""
    protected: Tensor
    """[B, Hkv, n] bool: slots the engine will keep whatever the score (prompt or sinks)."""
    layer: int
    event: int
    """Index of this eviction event for this layer and batch (0 for the first)."""
    step: int
    """Tokens seen so far, prompt included: the next token gets position ``step``."""
    prompt_len: int
    budget: int
    """K: cache length right after eviction, buffer included."""
    keep: int
    """K − B: candidates kept per KV head (protected ones included)."""
    model: ModelFacts
    state: LayerState
    rngs: tuple[torch.Generator, ...]
    """One generator per batch row, seeded from (row seed, layer, event)."""
    recent_queries: Tensor | None = None
    """The queries the engine recorded: None unless the policy needs ``queries``. Read ``queries``."""
    calibration: Any = None
    """Per-model statistics, when the policy needs ``calibration``."""
    output_projection: Tensor | None = None
    """[hidden, Hq·D] this layer's W_O (``o_proj.weight``), when the policy needs ``output_projection``."""

    @property
    def queries(self) -> Tensor:
        """[B, Hq, W, D] the last W post-RoPE queries, for a policy that needs ``queries``."""
        if self.recent_queries is None:
            raise AttributeError(
                "view.queries is recorded only for a policy that declares it: "
                "@policy(name, needs={'queries'})"
            )
        return self.recent_queries

    @property
    def num_candidates(self) -> int:
        return self.keys.shape[2]

    def candidate_slot(self, name: str) -> Tensor:
        """The candidates' part of a registered slot tensor (the buffer's slots cut off)."""
        return self.state.slot(name)[:, :, : self.num_candidates]

    # Draws: one generator per row, so that a row's draws do not depend on the other rows in the batch.
    def uniform(self, *shape: int) -> Tensor:
        """U[0, 1) of shape [B, *shape], float32, on the keys' device."""
        return self._draw(torch.rand, shape)

    def normal(self, *shape: int) -> Tensor:
        """N(0, 1) of shape [B, *shape], float32, on the keys' device."""
        return self._draw(torch.randn, shape)

    def gumbel(self, *shape: int) -> Tensor:
        """Standard Gumbel(0, 1) noise of shape [B, *shape]."""
        tiny = torch.finfo(torch.float32).tiny
        u = self.uniform(*shape).clamp_(min=tiny, max=1.0 - 1e-7)
        return -torch.log(-torch.log(u))

    def _draw(self, fn: Callable[..., Tensor], shape: tuple[int, ...]) -> Tensor:
        device = self.keys.device
        return torch.stack([fn(shape, generator=g, device=device, dtype=torch.float32) for g in self.rngs])


@dataclass(frozen=True)
class StepView:
    """What ``observe`` sees after a forward step of one layer (for policies needing ``step_attention``)."""

    attention: Tensor
    """[B, Hq, q, S] softmax probabilities of the step's q new queries over all S cached slots."""
    positions: Tensor
    """[B, Hkv, S] positions of the cached slots."""
    layer: int
    step: int
    model: ModelFacts
    state: LayerState


class Policy:
    """Base class of every scorer. Subclass it and decorate the subclass with ``@policy(name)``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    needs: ClassVar[frozenset[Need]] = frozenset()
    evicts: ClassVar[bool] = True
    """False only for ``full``: the engine never evicts."""
    layer_reduce: ClassVar[Literal["none", "mean"]] = "none"
    """``mean``: the engine averages the layers' scores and keeps one keep-set for every layer."""
    source_sha256: ClassVar[str | None] = None
    """The SHA-256 of the file a scorer was loaded from (None for built-ins and installed packages): part
    of its results' identity, so that an edited file never reuses the old file's results."""
    source_file: ClassVar[str | None] = None
    """That file's name, as the leaderboard shows its source (not part of the identity)."""

    @property
    def query_window(self) -> int:
        """How many recent queries ``score`` reads (0 unless the policy needs ``queries``)."""
        return 0

    def score(self, view: EvictionView) -> Tensor:
        """Return [B, Hkv, n] scores, float32, finite or -inf; higher = keep."""
        raise NotImplementedError

    def observe(self, step: StepView) -> None:
        """Called after every forward step when the policy needs ``step_attention``."""

    def params(self) -> dict[str, Any]:
        """The policy's parameters, as recorded with results."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


class WindowedPolicy(Policy):
    """A policy that reads the last ``window`` queries: a subclass declares ``window: int`` with its
    default, and the engine records that many (``query_window``)."""

    window: int

    @property
    def query_window(self) -> int:
        return self.window

    def recent_queries(self, view: EvictionView) -> Tensor:
        """[B, Hq, W, D] the last ``window`` of the view's queries."""
        return view.queries[:, :, -self.window :]


P = TypeVar("P", bound=type[Policy])


def policy(name: str, *, needs: set[Need] | frozenset[Need] = frozenset()) -> Callable[[P], P]:
    """Register a Policy subclass under ``name``; its fields become validated, frozen parameters.

    The class docstring's first line is the policy's one-line description. ``name`` must match
    POLICY_NAME (ValueError otherwise).
    """
    problem = policy_name_problem(name)
    if problem:
        raise ValueError(f"@policy: {problem}")
    unknown = set(needs) - set(NEEDS)
    if unknown:
        raise ValueError(f"policy {name!r}: unknown needs {sorted(unknown)}; known: {list(NEEDS)}")

    def wrap(cls: P) -> P:
        if not issubclass(cls, Policy):
            raise TypeError(f"@policy({name!r}) decorates a subclass of kvbench.Policy, not {cls!r}")
        config = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)
        cls = cast(P, pydantic.dataclasses.dataclass(frozen=True, config=config)(cls))
        cls.name = name
        cls.needs = frozenset(needs)
        lines = (cls.__doc__ or "").strip().splitlines()
        cls.description = lines[0] if lines else name
        setattr(cls, "__kvbench_policy__", True)  # noqa: B010  (marks the class itself, not its subclasses)
        return cls

    return wrap


def is_policy_class(obj: object) -> TypeGuard[type[Policy]]:
    return isinstance(obj, type) and issubclass(obj, Policy) and obj.__dict__.get("__kvbench_policy__", False)
