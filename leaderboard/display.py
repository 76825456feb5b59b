"""How the leaderboard writes values for people: missing cells, policy parameters, arm labels."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MISSING = "—"
"""Shown for an empty cell in every table (Streamlit would print "None")."""


def parameters_text(params: str | Mapping[str, Any] | None) -> str:
    """A policy's parameters as ``key=value, key=value`` (the stored form is a JSON object)."""
    if params is None:
        return MISSING
    values = json.loads(params) if isinstance(params, str) else params
    if not isinstance(values, Mapping):
        return str(values)
    if not values:
        return MISSING
    return ", ".join(f"{key}={_value(value)}" for key, value in values.items())


def _value(value: Any) -> str:
    # strings bare, everything else in its JSON spelling (true, null, [1, 2]) so nothing reads ambiguously
    return value if isinstance(value, str) else json.dumps(value)


def setting_label(policy: str, params: str) -> str:
    """A policy with one setting of its parameters, where the table has several of that policy."""
    text = parameters_text(params)
    return f"{policy} ({'defaults' if text == MISSING else text})"
