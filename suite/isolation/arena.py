"""A request's large tensors through a file in memory that both processes map, instead of through the pipe.

Through the pipe, a batch-16 event's 270 MB of keys and values were copied six times (a contiguous clone,
safetensors' bytes, the frame, the pipe, the read, the tensors) at a few hundred MB/s. Through the arena
they are copied once: the parent writes them into a file of a tmpfs (/dev/shm where there is one) and
names the file, each tensor's dtype, shape and offset in the request's header; the child maps the file and
reads them in place.

The child cannot change what the parent reads: the arena's folder is bound read-only inside the sandbox,
its files are the parent's (mode 0644), and the child maps them privately (a write of its own makes its
own copy of the page). It cannot shrink a file under the parent's mapping either. Replies still come back
through the pipe, where the parent checks every shape, dtype and length before using them (no pickle on
either side). A header naming another file, a dtype outside DTYPES, or a tensor past the file's end is a
WireError on the child's side.
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

from kvbench.isolation.wire import WireError

SMALLEST = 64 << 10
"""Tensors under this many bytes stay in the pipe's frame: a mapping is worth it for the big ones only."""
ALIGN = 64
_KNOWN = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16)
DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d for d in (*_KNOWN, torch.int8, torch.uint8, torch.bool)
}
FILE_NAME = re.compile(r"[0-9]{1,9}\.arena")


def _memory_folder() -> str | None:
    """/dev/shm when this machine has a writable one (pages in memory, never written back to a disk)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


class Arena:
    """The parent's side: a folder of arena files, the newest mapped for writing."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="kvbench-arena-", dir=_memory_folder()))
        self.folder.chmod(0o755)  # the sandbox's user reads it
        self.files = 0
        self.name = ""
        self.view: mmap.mmap | None = None
        self.pending: dict[str, tuple[Tensor, int]] = {}

    def place(
        self, tensors: dict[str, Tensor], later: frozenset[str] = frozenset()
    ) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """Write the large CPU tensors into the arena: (their layout for the header, the ones left for the
        pipe). The layout is empty when every tensor is small. Those named in ``later`` get their room but
        are written only if ``deliver`` asks for them, before the next ``place``."""
        large = {k: t for k, t in tensors.items() if t.device.type == "cpu" and _bytes(t) >= SMALLEST}
        self.pending = {}
        if not large:
            return {}, tensors
        offsets, end = {}, 0
        for name, t in large.items():
            offsets[name] = end
            end += -(-_bytes(t) // ALIGN) * ALIGN
        if self.view is None or end > len(self.view):
            try:
                self._grow(end)
            except OSError:  # the tmpfs is full (a container's /dev/shm is 64 MiB): the pipe carries all
                return {}, tensors
        self.pending = {k: (t, offsets[k]) for k, t in large.items() if k in later}
        layout = self._write({k: (t, offsets[k]) for k, t in large.items() if k not in later})
        left = {k: t for k, t in tensors.items() if k not in large}
        return {"file": self.name, "tensors": layout, "later": sorted(self.pending)}, left

    def deliver(self, names: list[str]) -> dict[str, Any]:
        """Write tensors the last ``place`` held back, into the room it kept: their layout."""
        chosen = {name: self.pending.pop(name) for name in names}
        return {"file": self.name, "tensors": self._write(chosen), "later": sorted(self.pending)}

    def _write(self, placed: dict[str, tuple[Tensor, int]]) -> dict[str, Any]:
        assert self.view is not None
        layout = {}
        for name, (t, offset) in placed.items():
            target = torch.frombuffer(self.view, dtype=t.dtype, count=t.numel(), offset=offset)
            target.view(t.shape).copy_(t)
            dtype = str(t.dtype).removeprefix("torch.")
            layout[name] = {"dtype": dtype, "shape": list(t.shape), "offset": offset}
        return layout

    def _grow(self, needed: int) -> None:
        """A new, larger file (the child maps it at its next request); the old one is unlinked at once, its
        mapping in the child lasting until the child moves on."""
        size = max(needed, 2 * len(self.view)) if self.view is not None else needed
        self.close_file()
        self.files += 1
        self.name = f"{self.files}.arena"
        path = self.folder / self.name
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
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
        shutil.rmtree(self.folder, ignore_errors=True)


def _bytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class ArenaReader:
    """The child's side: the tensors a request's header places in the arena, read in place."""

    def __init__(self) -> None:
        self.path = ""
        self.view: mmap.mmap | None = None

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
            self.path = path
        assert self.view is not None
        return {name: self._tensor(name, entry) for name, entry in spec["tensors"].items()}

    def _tensor(self, name: str, entry: Any) -> Tensor:
        try:
            dtype = DTYPES[entry["dtype"]]
            shape = [int(s) for s in entry["shape"]]
            offset = int(entry["offset"])
        except (KeyError, TypeError, ValueError):
            raise WireError(f"arena tensor {name!r}: not {{dtype, shape, offset}} of a known dtype") from None
        count = 1
        for size in shape:
            count *= size
        if min(shape, default=0) < 0 or offset < 0 or offset + count * dtype.itemsize > len(self.view or b""):
            raise WireError(f"arena tensor {name!r}: shape {shape} at offset {offset} ends past the file")
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self.view, dtype=dtype, count=count, offset=offset).view(shape)
