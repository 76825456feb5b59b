"""The child's side of the wire: a hello, then one reply per request, until the parent closes.

Shared by the isolated scorer's child (kvbench.isolation.child) and kvpress's (kvbench.kvpress.child).
Replies go out on the stdout the process found at start, which is then pointed at stderr so that what
the scorer prints cannot corrupt the replies. Whatever the scorer raises (SystemExit, KeyboardInterrupt
and MemoryError included) is sent back by name; the parent decides what it means (``raised`` reads it
back as the parent's error).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from kvbench.errors import ScorerError
from kvbench.isolation import wire
from kvbench.isolation.arena import ArenaReader

MAX_REQUEST = 1 << 34


class Arrivals(dict):
    """A request's tensors, and those the parent held back (``later``), which cross when first read."""

    def __init__(
        self, tensors: dict[str, Tensor], later: list[str], fetch: Callable[[list[str]], dict[str, Tensor]]
    ) -> None:
        super().__init__(tensors)
        self.later, self.fetch = set(later), fetch

    def __missing__(self, name: str) -> Tensor:
        if name not in self.later:
            raise KeyError(name)
        self.later.discard(name)
        self.update(self.fetch([name]))
        return self[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self or name in self.later else default


def failure(exc: BaseException) -> dict[str, Any]:
    """An exception as a reply header: its name, message and the end of its trace."""
    frames = traceback.format_exception(exc)
    return {
        "ok": False,
        "error": type(exc).__name__,
        "message": str(exc)[:2000],
        "trace": "".join(frames)[-4000:],
    }


def raised(where: str, reply: dict[str, Any], note: str = "") -> ScorerError:
    """The parent's error for a ``failure`` reply: what the child raised at ``where`` (``note`` added to its
    message), and the end of its trace."""
    detail = "\n".join(str(reply.get("trace", "")).strip().splitlines()[-6:])
    name, message = reply.get("error", "an error"), reply.get("message", "")
    return ScorerError(f"{where} raised {name}: {message}{note}\n{detail}")


def serve(
    hello: Callable[[dict[str, Any]], dict[str, Any]],
    answer: Callable[[dict[str, Any], dict[str, Tensor]], wire.Frame],
    *,
    failure: Callable[[BaseException], dict[str, Any]] = failure,
    started: bool = False,
) -> None:
    """Answer the parent on stdin/stdout: ``hello(first header)`` once, then ``answer`` per request.
    ``failure`` turns what they raise into a reply; ``started``: first a frame saying the process runs."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    torch.set_num_threads(1)
    if started:
        wire.write(replies, {"ok": True, "op": "started"}, {})
    header, _ = wire.read(requests, MAX_REQUEST)
    try:
        greeting = hello(header)
        wire.encode(greeting, {})  # a parameter that is not JSON fails here, by name
    except BaseException as exc:
        wire.write(replies, failure(exc), {})
        return
    wire.write(replies, greeting, {})
    arena = ArenaReader()

    def fetch(names: list[str]) -> dict[str, Tensor]:
        wire.write(replies, {"op": "fetch", "names": names}, {})
        header, tensors = wire.read(requests, MAX_REQUEST)
        return {**tensors, **arena.tensors(header["arena"])}

    while True:
        try:
            header, tensors = wire.read(requests, MAX_REQUEST)
        except wire.WireError:
            return  # the parent closed the channel
        if header.get("op") == "close":
            return
        try:
            later: list[str] = []
            if "arena" in header:  # the large tensors, in the file both sides map (kvbench.isolation.arena)
                spec = header.pop("arena")
                tensors = {**tensors, **arena.tensors(spec)}
                later = [str(name) for name in spec.get("later", [])]
            data = wire.encode(*answer(header, Arrivals(tensors, later, fetch)))
        except BaseException as exc:
            data = wire.encode(failure(exc), {})
        replies.write(data)
        replies.flush()
