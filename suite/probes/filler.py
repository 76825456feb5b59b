"""Seeded synthetic reasoning-like filler: the text a model 'thinks' between a needle and its query."""

from __future__ import annotations

import random
from collections.abc import Callable

_Template = Callable[[random.Random], str]


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(12, 99), rng.randint(2, 9)
    return f"Let me compute {a} times {b}, which gives {a * b}."


def _check(rng: random.Random) -> str:
    a, b = rng.randint(100, 999), rng.randint(10, 99)
    return f"Wait, let me double-check: {a} minus {b} is {a - b}, so that step holds."


def _plan(rng: random.Random) -> str:
    step = rng.choice(
        ["factor the expression", "draw the triangle", "list the small cases", "set up an equation"]
    )
    return f"Next I should {step} before going further."


def _doubt(rng: random.Random) -> str:
    n = rng.randint(3, 12)
    return f"Hmm, maybe the pattern repeats every {n} steps; I will test a few values to see."


def _sum(rng: random.Random) -> str:
    values = [rng.randint(1, 50) for _ in range(3)]
    return f"Adding {values[0]}, {values[1]} and {values[2]} gives {sum(values)}."


def _conclude(rng: random.Random) -> str:
    return rng.choice(
        [
            "That case is settled, so I move on.",
            "So far everything is consistent.",
            "This agrees with the earlier estimate.",
            "I will keep this result for later.",
        ]
    )


TEMPLATES: tuple[_Template, ...] = (_arithmetic, _check, _plan, _doubt, _sum, _conclude)


def filler_tokens(rng: random.Random, count_tokens: Callable[[str], int], tokens: int) -> str:
    """Filler text of at least ``tokens`` tokens by ``count_tokens``, built sentence by sentence."""
    sentences, total = [], 0
    while True:  # one sentence more is drawn than kept, as the stored probes were built
        sentence = rng.choice(TEMPLATES)(rng)
        if total >= tokens:
            break
        sentences.append(sentence)
        total += count_tokens(" " + sentence)
    return " " + " ".join(sentences)
