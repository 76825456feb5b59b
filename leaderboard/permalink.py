"""Permalinks: the page's selection lives in the URL's query parameters.

A widget keyed ``key`` is read from the query parameter of the same name on the session's first run
(before the widget is drawn, so its options are known), and every run ends by writing the selection
back, so the address bar is always a link to what is on screen. A value that is not among the widget's
options is ignored: the widget keeps its default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any, TypeVar

import streamlit as st

from kvbench.leaderboard.queries import Compression

T = TypeVar("T")

_SEEDED = "_permalink_seeded"
"""Session-state set of the keys already read from the URL: the URL is read once per key and session."""


def from_url(
    key: str,
    options: Sequence[T] | None = None,
    encode: Callable[[T], str] = str,
    *,
    params: Mapping[str, str] | None = None,
    state: MutableMapping[Any, Any] | None = None,
) -> None:
    """Give widget ``key`` the option the URL names, the first time the session draws it. Without
    ``options`` (a text input) any text is taken: it only selects rows."""
    url: Mapping[str, str] = st.query_params if params is None else params
    session: MutableMapping[Any, Any] = st.session_state if state is None else state
    seeded: set[str] = session.setdefault(_SEEDED, set())
    if key in seeded:
        return
    seeded.add(key)
    wanted = url.get(key)
    if wanted is None:
        return
    if options is None:
        session[key] = wanted
        return
    for option in options:
        if encode(option) == wanted:
            session[key] = option
            return


def to_url(selection: Mapping[str, str | None]) -> None:
    """Write the selection into the URL; empty values are left out, so a default page has a short URL."""
    wanted = {key: value for key, value in selection.items() if value}
    if dict(st.query_params) != wanted:
        st.query_params.from_dict(wanted)


def compression_code(compression: Compression | None) -> str:
    """``4x`` for a ratio, ``K384`` for a fixed budget: short and readable in a link."""
    if compression is None:
        return ""
    return f"{compression.ratio:g}x" if compression.ratio else f"K{compression.budget}"
