"""The parent's ends of an isolated scorer's stdin and stdout (kvbench.isolation.host): non-blocking, each
read and write bounded by the call's deadline."""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import time

PIPE_BYTES = 1 << 20
"""Each pipe's room (64 KiB by default, 1 MiB the default cap for a user): a batch's reply crosses in one
write and is read at once, where it took a wake-up of each side per 64 KiB."""


class Pipes:
    """The scorer's stdin and stdout: ``write(data)`` and a file-like ``read(n)``, each raising TimeoutError
    past ``deadline``. Each pipe has one selector for the process's life: an event's request and reply
    cross in many pipe-sized chunks, and a selector per chunk would cost system calls on every one."""

    def __init__(self, stdin: int, stdout: int) -> None:
        self.stdin, self.stdout, self.deadline = stdin, stdout, 0.0
        self.unread = memoryview(b"")  # what one read brought past the bytes asked for
        self.readable, self.writable = selectors.DefaultSelector(), selectors.DefaultSelector()
        for fd, selector, event in ((stdout, self.readable, selectors.EVENT_READ),
                                    (stdin, self.writable, selectors.EVENT_WRITE)):  # fmt: skip
            os.set_blocking(fd, False)
            selector.register(fd, event)
            with contextlib.suppress(OSError):  # a kernel's cap below it: the pipe stays as it is
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)

    def read(self, count: int) -> bytes:
        """Up to ``count`` bytes; a frame's lengths, header and payload come from as few reads as the pipe
        allows (each read takes what is there: a pipe holds 64 KiB)."""
        if not self.unread:
            self._wait(self.readable)
            self.unread = memoryview(os.read(self.stdout, min(max(count, 1 << 16), 1 << 24)))
        chunk, self.unread = self.unread[:count], self.unread[count:]
        return bytes(chunk)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._wait(self.writable)
            try:
                view = view[os.write(self.stdin, view) :]
            except BlockingIOError:
                continue

    def _wait(self, selector: selectors.BaseSelector) -> None:
        """Return once the selector's pipe is ready; TimeoutError past ``deadline``."""
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if selector.select(timeout=min(remaining, 1.0)):
                return

    def close(self) -> None:
        self.readable.close()
        self.writable.close()
