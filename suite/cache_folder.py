"""kvbench's cache folder: where converted model weights, captured bench keys and the paces of earlier runs
are kept between runs. A module of its own, importing nothing heavy: the runner reads it on an adapter
that never loads transformers."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "KVBENCH_CACHE"
"""The one setting for kvbench's cache folder (default ``$XDG_CACHE_HOME/kvbench``, or ~/.cache/kvbench)."""


def cache_root() -> Path:
    """``$KVBENCH_CACHE``, else the XDG cache folder's ``kvbench``."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvbench"
