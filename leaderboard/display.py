"""How the leaderboard writes values for people: missing cells, policy parameters, arm labels, tables of
many runs, and text from a scorer or a bundle inside the page's Markdown."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

MISSING = "—"
"""Shown for an empty cell in every table (Streamlit would print "None")."""


_MARKUP = re.compile(r"[\\`*_\[\](){}<>!|~$:&#.@]|^[-+]")
"""What Markdown reads: emphasis, code, links and images, HTML and entities, tables, strikethrough,
Streamlit's LaTeX ($) and colour/badge/icon directives (:red[...]), headings and a list item's mark at
the start."""
_AUTOLINK = re.compile(r"(?<=:)(?=//)|(?<=www)(?=\.)|(?=@)", re.IGNORECASE)
"""Where GitHub-flavoured Markdown's bare links begin (``http://``, ``www.``, an address's ``@``)."""
JOINER = "\u2060"
"""WORD JOINER: invisible, and no part of a URL, so that no link is found in the text around it."""


def literal(text: object) -> str:
    """``text`` as the same characters in a Streamlit Markdown element (st.markdown, st.caption, st.info,
    st.subheader, a column's help): a name, a parameter or a submitter from a bundle becomes text, never
    a link, an image, emphasis or a heading. Each character Markdown reads is written as a numeric
    character reference (``&#42;`` for ``*``), which Markdown shows as that character and never reads as
    markup. GFM finds bare links in the text after that (``http&#58;//x`` is still a link), so an
    invisible JOINER goes where a bare link would begin. Line breaks become spaces, as Markdown shows
    them."""
    flat = _AUTOLINK.sub(JOINER, " ".join(str(text).splitlines()))
    return _MARKUP.sub(lambda m: f"&#{ord(m.group())};", flat)


def chart_text(text: object) -> str:
    """``text`` for a plotly title, trace name or axis category: plotly reads a few HTML tags there (``<a
    href>`` makes a link, ``<b>``, ``<br>``, ``<span style>``); written as entities, ``<``, ``>`` and ``&``
    are drawn as themselves."""
    return html.escape(str(text), quote=False)


def code(text: str) -> str:
    """``text`` as a Markdown code span (shown as it is), fenced by more backticks than it holds in a row.
    A code span ends at a blank line (where its paragraph ends), so line breaks become spaces, as
    Markdown shows them inside a span anyway: a model name from a bundle with "\\n\\n" in it would
    otherwise close the span and have the rest read as Markdown."""
    flat = " ".join(str(text).splitlines())
    fence = "`" * (max(map(len, re.findall("`+", flat)), default=0) + 1)
    return f"{fence} {flat} {fence}"


def parameters_text(params: str | Mapping[str, Any] | None) -> str:
    """A policy's parameters as ``key=value, key=value`` (the stored form is a JSON object)."""
    if params is None:
        return MISSING
    values = json.loads(params) if isinstance(params, str) else params
    if not isinstance(values, Mapping):
        return str(values)
    if not values:
        return MISSING
    # strings bare, everything else in its JSON spelling (true, null, [1, 2]) so nothing reads ambiguously
    return ", ".join(f"{key}={v if isinstance(v, str) else json.dumps(v)}" for key, v in values.items())


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
