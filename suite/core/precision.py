"""Mixed precision, a protocol option orthogonal to the policy: which cached tokens stay in the model's
precision, how the rest are stored, and how a byte budget becomes a token budget.

The high-precision set of each KV head is the buffer plus ``high_precision`` (N_hp) tokens chosen by the
largest value range, Range(v) = max − min over the head dimension (the VASE paper's quantity). Every
other cached token has its key and value quantized per token at ``bits``, in groups of ``group``
channels (kvbench.core.quantize). A token that leaves the high-precision set is quantized and never
promoted back. Which member leaves when a larger-range token arrives (``demote``):

- ``oldest``: a token leaving the buffer joins the set when its range is among the N_hp largest of the
  set and the newcomers; the set then sheds its oldest members (the VASE paper's stated future work);
- ``smallest-range``: the set keeps the N_hp largest ranges, whatever their age.

Choices recorded: keys are quantized per token like values (one cache format, one accounting); the
protocol's protected prompt is kept (never evicted) but may be quantized; positions are bookkeeping for
policies and are not counted as cache bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from kvbench.core.quantize import RowQuantizer
from kvbench.errors import BudgetError

Demotion = Literal["oldest", "smallest-range"]


def refuse_unknown(field: str, value: object, choices: Any) -> None:
    """Raise BudgetError unless ``value`` is one of the ``Literal`` ``choices``, naming them in order."""
    allowed = get_args(choices)
    if value not in allowed:
        named = [repr(choice) for choice in allowed]
        raise BudgetError(f"{field} must be {', '.join(named[:-1])} or {named[-1]}, got {value!r}")


@dataclass(frozen=True)
class MixedPrecision:
    bits: int
    group: int = 32
    high_precision: int = 0
    """N_hp: high-precision tokens per KV head besides the buffer (0 quantizes everything but the buffer)."""
    demote: Demotion = "oldest"

    def __post_init__(self) -> None:
        RowQuantizer(self.bits, self.group)  # validates bits and group
        if self.high_precision < 0:
            raise BudgetError(f"high_precision must be >= 0 tokens, got {self.high_precision}")
        refuse_unknown("demote", self.demote, Demotion)

    @property
    def quantizer(self) -> RowQuantizer:
        return RowQuantizer(self.bits, self.group)


@dataclass(frozen=True)
class TokenCost:
    """Bytes one cached token costs in one KV head of one layer (key plus value)."""

    full: int
    """In the model's precision."""
    quantized: int
    """Packed at the protocol's bits, scales and offsets included."""

    @classmethod
    def of(cls, head_dim: int, element_size: int, precision: MixedPrecision | None) -> TokenCost:
        full = 2 * head_dim * element_size
        quantized = 2 * precision.quantizer.vector_bytes(head_dim) if precision is not None else full
        return cls(full, quantized)


def footprint(tokens: int, buffer: int, cost: TokenCost, precision: MixedPrecision | None) -> int:
    """Bytes per KV head of a cache holding ``tokens`` right after an event (the buffer included)."""
    if precision is None:
        return tokens * cost.full
    high = min(tokens, precision.high_precision + buffer)
    return high * cost.full + (tokens - high) * cost.quantized


def tokens_for_bytes(
    equivalent: int, buffer: int, cost: TokenCost, precision: MixedPrecision | None, *, multiple: int = 1
) -> int:
    """The most tokens whose footprint fits the bytes of ``equivalent`` tokens in the model's precision,
    rounded down to ``multiple``."""
    if precision is None:
        return equivalent
    high = precision.high_precision + buffer
    if equivalent <= high:
        raise BudgetError(
            f"a byte budget of {equivalent} full-precision tokens per KV head leaves no room for quantized "
            f"tokens beside N_hp = {precision.high_precision} high-precision tokens and the {buffer}-token "
            "buffer: lower high_precision or raise the budget"
        )
    tokens = high + (equivalent - high) * cost.full // cost.quantized
    return tokens // multiple * multiple
