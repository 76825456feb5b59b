"""A request's tensors through a file in memory that both processes map, instead of through the pipe.

Through the pipe, a batch-16 event's 270 MB of keys and values were copied six times (a contiguous clone,
the encoded bytes, the frame, the pipe, the read, the tensors) at a few hundred MB/s. Through the arena
they are copied once: the parent writes them into a file of a tmpfs (/dev/shm where there is one) and
names the file, each tensor's dtype, shape and offset in the request's header; the child maps the file and
reads them in place.

No one but the two reads a request's tensors: the folder and its files are the parent's, readable by the
scorer's group only (mode 0751 and 0640) when the scorer runs as a user of its own, else by the parent's
user only (0711 and 0600), which is then the scorer's too; other users may pass through the folder (bwrap
binds it as the scorer's user) but neither list nor read it. The child cannot change what the parent reads:
the arena's folder is bound read-only inside the sandbox, and the child maps its files privately (a
write of its own makes its own copy of the page). It cannot shrink a file under the parent's mapping
either. Replies still come back through the pipe, where the parent checks every shape, dtype and length
before using them (no pickle on either side). A header naming another file, or a layout that
kvbench.isolation.wire refuses (a dtype outside its DTYPES, a tensor past the file's end), is a WireError
on the child's side.
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from kvbench.isolation import wire
from kvbench.isolation.wire import WireError

FILE_NAME = re.compile(r"[0-9]{1,9}\.arena")


def _memory_folder() -> str | None:
    """/dev/shm when this machine has a writable one (pages in memory, never written back to a disk)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


class Arena:
    """The parent's side: a folder of arena files, the newest mapped for writing."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="kvbench-arena-", dir=_memory_folder()))
        self.folder.chmod(0o711)  # the sandbox's user reaches it (bwrap binds it as that user), lists nothing
        self.group: int | None = None
        self.files = 0
        self.name = ""
        self.view: mmap.mmap | None = None
        self.pending: dict[str, tuple[Tensor, int]] = {}

    def share_with(self, group: int | None) -> None:
        """Let the scorer's group (a user of its own, kvbench.graders.sandbox.as_fresh_user) read the
        arena, and no one else; None: the scorer runs as this process's user, which reads it already."""
        self.group = group
        if group is not None:
            os.chown(self.folder, -1, group)
            self.folder.chmod(0o751)

    def place(
        self, tensors: dict[str, Tensor], later: frozenset[str] = frozenset()
    ) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """Write the CPU tensors into the arena: (their layout for the header, the ones left for the pipe:
        empty ones, and those on another device). Small ones come too: a copy into the mapping costs less
        than a frame's bytes on both sides, and a frame of JSON alone is read at once. The layout
        is empty when no tensor is placed. Those named in ``later`` get their room but are written only if
        ``deliver`` asks for them, before the next ``place``."""
        placed = {k: t for k, t in tensors.items() if t.device.type == "cpu" and t.numel() > 0}
        self.pending = {}
        if not placed:
            return {}, tensors
        room, end = wire.place(placed)
        if self.view is None or end > len(self.view):
            try:
                self._grow(end)
            except OSError:  # the tmpfs is full (a container's /dev/shm is 64 MiB): the pipe carries all
                return {}, tensors
        self.pending = {k: room[k] for k in placed if k in later}
        layout = self._write({k: room[k] for k in placed if k not in later})
        left = {k: t for k, t in tensors.items() if k not in placed}
        return {"file": self.name, "tensors": layout, "later": sorted(self.pending)}, left

    def deliver(self, names: list[str]) -> dict[str, Any]:
        """Write tensors the last ``place`` held back, into the room it kept: their layout."""
        chosen = {name: self.pending.pop(name) for name in names}
        return {"file": self.name, "tensors": self._write(chosen), "later": sorted(self.pending)}

    def _write(self, placed: dict[str, tuple[Tensor, int]]) -> dict[str, Any]:
        assert self.view is not None
        wire.write_at(self.view, placed)
        return wire.layout(placed)

    def _grow(self, needed: int) -> None:
        """A new, larger file (the child maps it at its next request); the old one is unlinked at once, its
        mapping in the child lasting until the child moves on."""
        size = max(needed, 2 * len(self.view)) if self.view is not None else needed
        self.close_file()
        self.files += 1
        self.name = f"{self.files}.arena"
        path = self.folder / self.name
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if self.group is not None:  # before a byte is written: readable by the scorer's group only
                os.fchown(descriptor, -1, self.group)
                os.fchmod(descriptor, 0o640)
            # the pages are taken now, or ENOSPC is raised here: a full tmpfs would otherwise answer a
            # write into the mapping with SIGBUS, which would end kvbench's own process
            os.posix_fallocate(descriptor, 0, size)
            self.view = mmap.mmap(descriptor, size)
        except OSError:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(descriptor)

    def close_file(self) -> None:
        if self.view is not None:
            self.view.close()
            self.view = None
            (self.folder / self.name).unlink(missing_ok=True)

    def close(self) -> None:
        self.close_file()
        self.pending = {}  # the caller's tensors, released here, on the thread that stops the scorer
        shutil.rmtree(self.folder, ignore_errors=True)


class ArenaReader:
    """The child's side: the tensors a request's header places in the arena, read in place."""

    def __init__(self) -> None:
        self.path = ""
        self.view: mmap.mmap | None = None
        self.data = torch.empty(0, dtype=torch.uint8)  # the mapping's bytes

    def tensors(self, spec: Any) -> dict[str, Tensor]:
        if not isinstance(spec, dict) or not isinstance(spec.get("tensors"), dict):
            raise WireError("an arena entry that is not {folder, file, tensors}")
        folder, name = str(spec.get("folder", "")), str(spec.get("file", ""))
        if not FILE_NAME.fullmatch(name):
            raise WireError(f"an arena file name {name[:40]!r} that is not NUMBER.arena")
        path = os.path.join(folder, name)
        if path != self.path:
            with open(path, "rb") as file:
                private = {"flags": mmap.MAP_PRIVATE, "prot": mmap.PROT_READ | mmap.PROT_WRITE}
                self.view = mmap.mmap(file.fileno(), 0, **private)
            self.data = torch.frombuffer(self.view, dtype=torch.uint8)
            self.path = path
        return wire.tensors_at(self.data, spec["tensors"])
