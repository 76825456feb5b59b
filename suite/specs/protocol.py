"""Protocol specs (suite/protocols/*.yaml): everything a policy and the null must share."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pydantic

from kvbench.specs.loading import StrictSpec, find_spec_file, load_spec, spec_names
from kvbench.specs.model import Family

if TYPE_CHECKING:  # the engine's types load torch, which readers of specs (the leaderboard) never need
    from kvbench.core.precision import MixedPrecision
    from kvbench.core.schedule import Schedule


class SamplingSpec(StrictSpec):
    temperature: float = pydantic.Field(ge=0.0)
    """0 = greedy (never for thinking models' benchmarks)."""
    top_p: float = pydantic.Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = pydantic.Field(default=0, ge=0)
    """0 = off."""


MAX_TOKENS = 1 << 24
"""Upper bound of every token count a spec gives (16M tokens): larger values are typos, never contexts."""


class BudgetRule(StrictSpec):
    """K = N_avg / ratio rounded to a multiple of the buffer (at least one buffer above it), or a fixed K."""

    ratio: float | None = pydantic.Field(default=None, gt=1.0, le=MAX_TOKENS)
    """Compression: K = N_avg / ratio, so a ratio of 1 or less would not compress."""
    fixed: int | None = pydantic.Field(default=None, gt=0, le=MAX_TOKENS)
    unit: Literal["tokens", "bytes"] = "tokens"
    """``bytes``: K is the memory of K tokens in the model's precision, and a mixed-precision cache holds
    as many tokens as fit it (equal-bytes comparisons); the same as ``tokens`` without ``precision``."""

    @pydantic.model_validator(mode="after")
    def _one_of(self) -> BudgetRule:
        if (self.ratio is None) == (self.fixed is None):
            raise ValueError("give exactly one of `ratio` (K = N_avg/ratio) or `fixed` (K in tokens)")
        return self

    def budget(self, n_avg: float, buffer: int) -> int:
        if self.fixed is not None:
            return self.fixed
        if self.ratio is None:  # the validator requires one of the two
            raise ValueError("a budget rule needs `fixed` or `ratio`")
        rounded = round(n_avg / self.ratio / buffer) * buffer
        return max(rounded, 2 * buffer)


class PrecisionSpec(StrictSpec):
    """A mixed-precision cache (kvbench.core.precision): the buffer and N_hp largest-range tokens per KV
    head in the model's precision, every other token's key and value at ``bits`` per channel."""

    bits: Literal[2, 4, 8]
    group: int = pydantic.Field(default=32, ge=8, le=1 << 12, multiple_of=8)
    """Channels per quantization group (one scale and offset each); must divide the head dimension."""
    high_precision: int = pydantic.Field(ge=0, le=MAX_TOKENS)
    """N_hp: high-precision tokens per KV head besides the buffer (0: uniform quantization)."""
    demote: Literal["oldest", "smallest-range"] = "oldest"
    """Which high-precision token is quantized when a larger-range one arrives."""

    def core(self) -> MixedPrecision:
        from kvbench.core.precision import MixedPrecision

        return MixedPrecision(self.bits, self.group, self.high_precision, self.demote)


DEFAULT_MARGIN = 0.02
"""The equivalence margin of a protocol that declares none: 2 points of pass@1 (or of a probe's metric)."""

NULL_POLICY = "random"
"""The null every comparison, table and verdict is against: Random Attention."""
FULL_CACHE_POLICY = "full"
"""The full cache, which never evicts: every Δ is measured from it."""
_ROLES = {
    "baseline": (NULL_POLICY, "the null: every comparison, table and verdict is against Random Attention"),
    "reference": (FULL_CACHE_POLICY, "the full cache: every Δ is measured from the cache that never evicts"),
}


class ProtocolSpec(StrictSpec):
    spec_version: Literal[1] = 1
    name: str
    description: str
    protection: Literal["prompt", "sinks", "none"]
    sinks: int = pydantic.Field(default=4, ge=0, le=MAX_TOKENS)
    """Protected leading tokens when ``protection: sinks``."""
    budget: BudgetRule
    buffer: int = pydantic.Field(default=64, ge=1, le=1 << 16)
    order: Literal["chronological", "score"] = "chronological"
    sampling: dict[Family, SamplingSpec]
    """Sampling per model family; every family a run uses must be listed."""
    seed: int = pydantic.Field(default=0, ge=0, lt=1 << 63)
    baseline: str = NULL_POLICY
    """The null baseline every policy is compared with (Random Attention)."""
    reference: str = FULL_CACHE_POLICY
    """The no-eviction reference."""
    margin: float = pydantic.Field(default=DEFAULT_MARGIN, gt=0.0, lt=1.0)
    """The equivalence margin, in the task's metric: a policy whose paired difference to the null lies
    inside ±margin (two one-sided tests) is *equivalent to the null*. Left out of a stored spec (and of
    the identity) unless set, so specs written before it existed read back with the default."""
    precision: PrecisionSpec | None = None
    """A mixed-precision cache for the policies and the null (the full-cache reference always keeps the
    model's precision); None keeps the model's precision everywhere."""

    @pydantic.field_validator("baseline", "reference")
    @classmethod
    def _null_and_full_cache(cls, value: str, info: pydantic.ValidationInfo) -> str:
        expected, what = _ROLES[str(info.field_name)]
        if value.partition(":")[0] != expected:
            raise ValueError(
                f"{value!r} is not {what}; write `{info.field_name}: {expected}` (parameters as in "
                f"{expected}:key=value are fine), and run other policies with --policy"
            )
        return value

    def identity(self) -> dict[str, object]:
        """The protocol as a run's identity records it: options left at their defaults that older
        kvbench releases lacked are left out, so that adding them moved no existing run id."""
        record = self.model_dump(mode="json", exclude={"description"})
        if record["precision"] is None:
            del record["precision"]
        if record["margin"] == DEFAULT_MARGIN:
            del record["margin"]
        if record["budget"]["unit"] == "tokens":
            del record["budget"]["unit"]
        return record

    def schedule(self, budget: int, *, from_ratio: bool) -> Schedule:
        """The schedule at budget K; a K derived from a ratio must be a multiple of the buffer."""
        from kvbench.core.schedule import Schedule

        return Schedule(
            budget=budget,
            buffer=self.buffer,
            protection=self.protection,
            sinks=self.sinks,
            order=self.order,
            budget_multiple_of_buffer=from_ratio,
            precision=self.precision.core() if self.precision is not None else None,
            budget_unit=self.budget.unit,
        )


def protocol_names() -> list[str]:
    return spec_names("protocols")


def load_protocol(name_or_path: str | Path) -> ProtocolSpec:
    return load_spec(find_spec_file("protocol", "protocols", str(name_or_path)), ProtocolSpec)
