"""Public mode: what a leaderboard served to anyone may show.

Set by `kvbench leaderboard --public` (and the Space and container entry points) through
KVBENCH_LEADERBOARD_PUBLIC. The page then names no database path, and every table is bounded; what is
never selected in any mode (private tasks' text, spec bodies with their local data paths, the hardware's
platform string) stays unselected. ``scrubbed`` is the last line of defence for free text that could
still carry a path or this machine's name.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping

import pandas as pd

PUBLIC_ENV = "KVBENCH_LEADERBOARD_PUBLIC"
ROW_CAP = 5_000
"""Most sample rows a drill-down shows or a samples download holds."""
OUTPUT_CAP = 16_000
"""Most characters of one output in a samples download: reasoning traces run to 100 kB each."""

_PATH = re.compile(r"(?<![\w.])(?:/|~/|[A-Za-z]:\\)[^\s,;'\"]+")
"""An absolute or home-relative path (POSIX or Windows): never meaningful to a visitor."""


def public_mode(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(PUBLIC_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def scrubbed(text: str) -> str:
    """``text`` with paths and this machine's host name replaced by "…"."""
    text = _PATH.sub("…", text)
    host = socket.gethostname()
    return text.replace(host, "…") if len(host) > 2 else text


def scrub_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Every text column of ``frame`` scrubbed (numbers and missing values untouched)."""
    out = frame.copy()
    for column in out.columns:
        if out[column].dtype == object:
            out[column] = out[column].map(lambda v: scrubbed(v) if isinstance(v, str) else v)
    return out
