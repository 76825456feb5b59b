"""The one way kvbench writes a file: whole or not at all. Readers (a resumed run, ingest, the leaderboard)
never see half a file, and a crash never leaves one under the real name: the temporary file sits in the same
folder (one file system, so the rename is atomic) and is removed on any failure. A write that fails for want
of room or permission is a :class:`StorageError` naming the file and what to do."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from kvbench.errors import StorageError

FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""The file system (or the process's file size limit) has no room for the file."""
DENIED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
"""The folder cannot take the file: no permission, or a read-only file system."""


def write_failure(path: Path, exc: OSError) -> NoReturn:
    """Raise what to tell the user when writing ``path`` failed with ``exc``; a failure that is not one of
    room or permission is raised as it is (then the original error says more)."""
    why = exc.strerror or str(exc)
    if exc.errno in FULL:
        raise StorageError(
            f"cannot write {path}: {why}. Free space on its file system (or write somewhere else), then run "
            "the same command again: every file written before is whole and kept, and `kvbench run` "
            "computes only what is missing"
        ) from exc
    if exc.errno in DENIED:
        # the file the system refused, when it is not one in the target's folder (a folder to create, a
        # file to copy from)
        other = exc.filename is not None and Path(os.fsdecode(exc.filename)).parent != path.parent
        where = f" ({os.fsdecode(exc.filename)})" if other else ""
        raise StorageError(
            f"cannot write {path}{where}: {why}. Give a folder you can write to, or make this one writable"
        ) from exc
    raise exc


def atomic_write(path: Path, write: Callable[[Path], object], *, once: bool = False) -> bool:
    """``write(temp)`` fills a temporary file that then replaces ``path``; True when it did.

    ``once``: ``path`` is created only if it does not exist (a hard link fails on an existing name), so of
    concurrent writers exactly one wins and no file another process may have read is ever replaced."""
    try:
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
    except OSError as exc:
        write_failure(path, exc)
