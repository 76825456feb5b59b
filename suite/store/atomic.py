"""The one way kvbench writes a file: whole or not at all. Readers (a resumed run, ingest, the leaderboard)
never see half a file, and a crash never leaves one under the real name: the temporary file sits in the same
folder (one file system, so the rename is atomic) and is removed on any failure."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: Path, write: Callable[[Path], object], *, once: bool = False) -> bool:
    """``write(temp)`` fills a temporary file that then replaces ``path``; True when it did.

    ``once``: ``path`` is created only if it does not exist (a hard link fails on an existing name), so of
    concurrent writers exactly one wins and no file another process may have read is ever replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(handle)
    temp = Path(name)
    try:
        write(temp)
        if not once:
            os.replace(temp, path)
        else:
            try:
                os.link(temp, path)
            except FileExistsError:
                return False
        return True
    finally:
        temp.unlink(missing_ok=True)
