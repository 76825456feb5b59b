"""The adapter interface: all the runner asks of a backend, and how a backend is found by name.

An adapter says what it provides (:class:`Capabilities`) and loads a model spec into a :class:`Backend`,
which tokenizes, teacher-forces a probe and decodes a batch of samples under an eviction policy. The
runner imports nothing else of a backend: ``hf`` (transformers) is one implementation, and the tests
run the whole runner on a second, minimal one. Built-in adapters are named in ``ADAPTERS``; a package
can add one under the ``kvbench.adapters`` entry-point group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from torch import Tensor

from kvbench.core.contract import ModelFacts, Need, Policy
from kvbench.core.engine import PinnedSlots
from kvbench.core.retention import Retention
from kvbench.core.schedule import ProtectedPrefix, Schedule
from kvbench.plugins import Registry


@dataclass(frozen=True)
class Capabilities:
    """What an adapter provides; the runner checks every cell against it before the first token."""

    needs: frozenset[Need]
    """The policy needs it can serve (recent queries, per-step attention, RoPE, calibration)."""
    devices: tuple[str, ...]
    """Device kinds, e.g. ("cpu", "cuda")."""
    dtypes: tuple[str, ...]
    attentions: tuple[str, ...]
    teacher_forcing: bool = True
    """Whether it can teacher-force (the probes and the fidelity metrics need it)."""
    mixed_precision: bool = False
    """Whether it can keep a mixed-precision cache (protocols with ``precision``)."""


@dataclass(frozen=True)
class Sampling:
    """Per-protocol sampling; temperature 0 means greedy (never for thinking models' benchmarks)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0


GREEDY = Sampling()


@dataclass
class Sample:
    tokens: list[int]
    text: str
    finish_reason: Literal["stop", "length"]
    evictions: int
    """Eviction events that happened while this sample was decoding."""
    retention: Retention | None = None
    """What its cache kept at its last eviction event (None without one, or from a backend that does not
    report it)."""

    @property
    def generated(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class KVBudget:
    """What a cell's budget means for one sequence's cache, all layers and KV heads together."""

    tokens: int
    """K: tokens held right after an event (a byte budget converted to tokens)."""
    bytes: int
    """What those K tokens cost, quantized ones packed (the byte budget)."""


@dataclass(frozen=True)
class ModelShape:
    """What a model's memory depends on, read from its config (no weights needed): the memory plan's input
    (kvbench.runner.memory)."""

    name: str
    dtype: str
    """The weights' and the cache's dtype, as the model spec names it (``bfloat16``)."""
    dtype_bytes: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    parameters: int
    """Every parameter once (tied embeddings count once)."""

    @property
    def kv_bytes_per_token(self) -> int:
        """One token's keys and values in every layer and KV head: layers × Hkv × D × 2 × dtype bytes."""
        return self.layers * self.kv_heads * self.head_dim * 2 * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        return self.parameters * self.dtype_bytes


@dataclass
class Generation:
    samples: list[Sample]
    prompt_tokens: int
    eviction_events: int
    eviction_seconds: float
    decode_seconds: float
    """Wall time of the decode steps (prefill excluded), evictions included."""
    peak_kv_bytes: int
    protected: ProtectedPrefix
    settings: dict[str, Any] = field(default_factory=dict)
    kv_budget: KVBudget | None = None


def before_stop(text: str, stop_strings: Sequence[str]) -> str:
    """The text before the first of ``stop_strings`` it contains (all of it when none)."""
    found = [i for i in (text.find(s) for s in stop_strings if s) if i >= 0]
    return text[: min(found)] if found else text


@dataclass(frozen=True)
class Watch:
    """Cached token positions whose survival a teacher-forced pass measures at one moment."""

    positions: tuple[int, ...]
    """Absolute positions of the watched tokens (a probe's needle)."""
    at: int
    """Continuation offset: measured in the cache that continuation token ``at`` attends to (the query)."""


@dataclass
class TeacherForced:
    logprobs: Tensor
    """[k, T] log p(continuation[t] | prompt, continuation[:t]) under the policy, per row."""
    greedy_match: Tensor
    """[k, T] bool: the policy's argmax equals continuation[t]."""
    kl_to_full: Tensor | None
    """[k, T] KL(full ‖ policy) of the next-token distributions, when a reference was asked for."""
    top1_agrees_with_full: Tensor | None
    """[k, T] bool: the policy's argmax equals the full cache's."""
    eviction_events: int
    eviction_seconds: float
    peak_kv_bytes: int
    survival: Tensor | None = None
    """[k, L, Hkv] share of the watched positions held by each layer's KV head (when a Watch was given)."""
    high_precision_survival: Tensor | None = None
    """[k, L, Hkv] share of the watched positions held in the model's precision (mixed-precision caches)."""
    kv_budget: KVBudget | None = None
    retention: list[Retention | None] | None = None
    """Per row: what its cache kept at the last eviction event."""
    watched_events: int | None = None
    """With a Watch: the eviction events at which every watched position was a candidate, before the
    watch's moment (the evictions a needle lived through before its question)."""

    def against_full(self) -> tuple[Tensor, Tensor]:
        """(kl_to_full, top1_agrees_with_full), which only a teacher-forced pass with a reference has."""
        if self.kl_to_full is None or self.top1_agrees_with_full is None:
            raise ValueError("this teacher-forced pass ran without the full cache's reference")
        return self.kl_to_full, self.top1_agrees_with_full


class Backend(Protocol):
    """A model loaded by an adapter."""

    facts: ModelFacts

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text (no special tokens)."""
        ...

    def prompt_ids(self, user_text: str) -> list[int]:
        """One user turn through the model's chat template, ready for the answer."""
        ...

    def teacher_force(
        self,
        prompt_ids: Sequence[int],
        continuation_ids: Sequence[int],
        policy: Policy,
        schedule: Schedule,
        *,
        row_seeds: Sequence[int],
        calibration: Any = None,
        reference: bool = False,
        refuse_capped_prompt: bool = False,
        pinned: PinnedSlots | None = None,
        watch: Watch | None = None,
    ) -> TeacherForced:
        """Score ``continuation_ids`` after ``prompt_ids`` once per row seed, evicting on the schedule;
        with ``watch``, also which of its positions each layer's KV heads hold at its moment."""
        ...

    def generate(
        self,
        prompt_ids: Sequence[int],
        policy: Policy,
        schedule: Schedule,
        *,
        sample_seeds: Sequence[int],
        sampling: Sampling,
        max_new_tokens: int,
        calibration: Any = None,
        refuse_capped_prompt: bool = False,
        ignore_stop: bool = False,
        stop_strings: Sequence[str] = (),
    ) -> Generation:
        """Decode one sample per seed from one prompt as a batch, evicting on the schedule; with
        ``ignore_stop``, every sample runs to ``max_new_tokens`` (benchmarks). A sample also ends once its
        text contains one of ``stop_strings`` (lm-eval's ``until``), and its text is cut before it."""
        ...

    def calibrate(self) -> Any:
        """Per-model query statistics for policies that need ``calibration``."""
        ...


class Adapter(Protocol):
    name: str

    def capabilities(self) -> Capabilities: ...

    def identity(self) -> dict[str, str]:
        """What of the adapter itself enters every cell's identity (the hf adapter: nothing, its results
        are pinned by the lock; vllm: the engine's version, since its kernels are the adapter's)."""
        ...

    def load(self, spec: Any, *, device: str, attention: str, progress: bool = True) -> Backend:
        """Load a model spec (its dtype included) onto ``device``; ``progress`` allows progress bars."""
        ...

    # Optional: ``shape(spec) -> ModelShape`` reads a model's config without its weights, for a memory plan
    # before anything loads (``kvbench run --plan-only``); a loaded backend may offer ``shape`` too. An
    # adapter without it (vllm: the engine plans its own memory) runs every problem's samples at once.


@contextmanager
def ended(backend: Backend) -> Iterator[Backend]:
    """Use a loaded backend, then end it: a backend with processes of its own (vllm) has ``close``."""
    try:
        yield backend
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()


ADAPTERS: Registry[Callable[[], Adapter]] = Registry(
    "adapter",
    "kvbench.adapters",
    {"hf": "kvbench.adapters.hf.backend:HFAdapter", "vllm": "kvbench.adapters.vllm.backend:VLLMAdapter"},
)


def find_adapter(name: str) -> Adapter:
    """The adapter called ``name``; an unknown name is refused with the known ones."""
    return ADAPTERS.get(name)()
