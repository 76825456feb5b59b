"""Separating a reasoning model's answer from its thinking."""

from __future__ import annotations

THINK_END = "</think>"


def final_answer(output: str, *, thinking: bool) -> str | None:
    """The text after the thinking. A thinking model's output without ``</think>`` has no answer."""
    if not thinking:
        return output
    _, found, tail = output.rpartition(THINK_END)
    return tail if found else None
