"""How the leaderboard writes values for people: missing cells, policy parameters, arm labels, tables of
many runs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

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


def split_shared(frame: pd.DataFrame, keep: tuple[str, ...]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``frame`` as (the columns whose values differ between its rows, with ``keep`` always; one row per
    column every row holds the same value of: ``field``, ``value``), so that a table of many runs made
    on one machine and commit fits a screen: what they share is said once."""
    shared = [c for c in frame.columns if c not in keep and frame[c].nunique(dropna=False) <= 1]
    values = [MISSING if frame.empty or pd.isna(frame[c].iloc[0]) else str(frame[c].iloc[0]) for c in shared]
    return frame.drop(columns=shared), pd.DataFrame({"field": shared, "value": values})
