"""The child's side of the wire: a hello, then one reply per request, until the parent closes.

Shared by the isolated scorer's child (kvbench.isolation.child) and kvpress's (kvbench.kvpress.child).
Replies go out on the stdout the process found at start, which is then pointed at stderr so that what
the scorer prints cannot corrupt the replies. Whatever the scorer raises (SystemExit, KeyboardInterrupt
and MemoryError included) is sent back by name; the parent decides what it means.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from kvbench.isolation import wire
from kvbench.isolation.arena import ArenaReader

MAX_REQUEST = 1 << 34


def failure(exc: BaseException) -> dict[str, Any]:
    """An exception as a reply header: its name, message and the end of its trace."""
    frames = traceback.format_exception(exc)
    return {
        "ok": False,
        "error": type(exc).__name__,
        "message": str(exc)[:2000],
        "trace": "".join(frames)[-4000:],
    }


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
    while True:
        try:
            header, tensors = wire.read(requests, MAX_REQUEST)
        except wire.WireError:
            return  # the parent closed the channel
        if header.get("op") == "close":
            return
        try:
            if "arena" in header:  # the large tensors, in the file both sides map (kvbench.isolation.arena)
                tensors = {**tensors, **arena.tensors(header.pop("arena"))}
            data = wire.encode(*answer(header, tensors))
        except BaseException as exc:
            data = wire.encode(failure(exc), {})
        replies.write(data)
        replies.flush()
