"""Probe problems: a chat stub, then a continuation that is teacher-forced through the decode path.

The continuation is a sequence of pieces (filler, needle, query, answer); each is tokenised on its own
and the token ids concatenated, so the answer's token positions are exact. The answer is scored by the
policy's greedy match and summed log-probability; fidelity scores every token against the full cache.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from kvbench.core.seeding import stable_seed
from kvbench.errors import SpecError
from kvbench.probes.filler import filler_tokens

Role = Literal["filler", "needle", "query", "answer"]
STUB = "Think through a long calculation. Along the way you will be given details to remember."
PASSKEY_NEEDLE = " IMPORTANT: the passcode is {value}. Remember it."
PASSKEY_QUERY = " What was the passcode again? The passcode is"
FACT_NEEDLE = " Let {var} = {value}."
FACT_QUERY = " Wait — I need the stored constants now. {var} ="
VARIABLES = ("alpha", "beta", "gamma", "delta", "kappa", "sigma", "omega", "theta")
LEAD_IN = 8
"""The fewest filler tokens before a needle."""
ANSWER = 4
"""The tokens a trace's length sets aside for the answer."""


@dataclass(frozen=True)
class Piece:
    role: Role
    text: str


@dataclass(frozen=True)
class ProbeProblem:
    problem_id: str
    stub: str
    pieces: tuple[Piece, ...]
    depth: int = 0
    """Filler tokens between the needle and its query (0 without a needle)."""

    def encoded(self, backend: Any) -> list[int]:
        """The stub's token ids on ``backend`` (the prompt, before the teacher-forced continuation)."""
        return backend.prompt_ids(self.stub)

    def token_pieces(self, encode: Callable[[str], list[int]]) -> list[tuple[Role, list[int]]]:
        return [(piece.role, encode(piece.text)) for piece in self.pieces]


def needle_problem(
    kind: Literal["passkey", "planted-fact"],
    index: int,
    *,
    seed: int,
    length: int,
    depth: int,
    count_tokens: Callable[[str], int],
) -> ProbeProblem:
    """A needle ``depth`` filler tokens before its query, in a trace of about ``length`` tokens."""
    rng = random.Random(stable_seed("probe", kind, seed, index))
    if kind == "passkey":
        value = str(rng.randint(10000, 99999))
        needle, query = PASSKEY_NEEDLE.format(value=value), PASSKEY_QUERY
    else:
        var, value = rng.choice(VARIABLES), str(rng.randint(1000, 9999))
        needle, query = FACT_NEEDLE.format(var=var, value=value), FACT_QUERY.format(var=var)
    needle_tokens, query_tokens = count_tokens(needle), count_tokens(query)
    around = needle_tokens + query_tokens + ANSWER + LEAD_IN  # the trace besides the depth's filler
    if depth + around > length:
        deeper = f"lower `source.depth` to at most {length - around} or " if length > around else ""
        raise SpecError(
            f"a {kind} probe of `source.length` {length} has no room for `source.depth` {depth} on this "
            f"model's tokenizer: the needle ({needle_tokens} tokens), the query ({query_tokens}), the answer "
            f"({ANSWER}) and at least {LEAD_IN} filler tokens before the needle take {around} tokens besides "
            f"the depth's filler; {deeper}raise `source.length` to at least {depth + around}"
        )
    before = length - depth - needle_tokens - query_tokens - ANSWER
    pieces = (
        Piece("filler", filler_tokens(rng, count_tokens, before)),
        Piece("needle", needle),
        Piece("filler", filler_tokens(rng, count_tokens, depth)),
        Piece("query", query),
        Piece("answer", " " + value),
    )
    return ProbeProblem(f"{kind}-{seed}-{index}", STUB, pieces, depth)


def fidelity_problem(
    index: int, *, seed: int, length: int, count_tokens: Callable[[str], int]
) -> ProbeProblem:
    """A reasoning-like trace of about ``length`` tokens, every token scored against the full cache."""
    rng = random.Random(stable_seed("probe", "fidelity", seed, index))
    return ProbeProblem(
        f"fidelity-{seed}-{index}", STUB, (Piece("filler", filler_tokens(rng, count_tokens, length)),)
    )
