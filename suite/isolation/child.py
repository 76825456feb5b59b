"""The isolated scorer's process: import the scorer file, then answer the parent's requests in turn.

Run by kvbench.isolation.host inside the boundary as ``python -I -m kvbench.isolation.child FILE CLASS``.
Requests come on stdin; replies go out on the stdout this process found at start, which is then pointed at
stderr so that the scorer's prints cannot corrupt the replies. Whatever the scorer raises (SystemExit,
KeyboardInterrupt and MemoryError included) is sent back by name; the parent decides what it means.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import torch

from kvbench.isolation import messages, wire

MAX_REQUEST = 1 << 34


def _failure(exc: BaseException) -> dict[str, Any]:
    frames = traceback.format_exception(exc)
    return {
        "ok": False,
        "error": type(exc).__name__,
        "message": str(exc)[:2000],
        "trace": "".join(frames)[-4000:],
    }


def _describe(policy: Any) -> dict[str, Any]:
    import inspect

    cls = type(policy)
    module = inspect.getmodule(cls)
    return {
        "ok": True,
        "name": policy.name,
        "needs": sorted(policy.needs),
        "evicts": bool(policy.evicts),
        "layer_reduce": policy.layer_reduce,
        "query_window": int(policy.query_window),
        "params": policy.params(),
        "description": policy.description,
        "summary": inspect.getdoc(cls) or "",
        "module_doc": (module.__doc__ or "") if module is not None else "",
        "class": cls.__qualname__,
    }


def serve(path: str, class_name: str) -> None:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    torch.set_num_threads(1)
    header, _ = wire.read(requests, MAX_REQUEST)
    try:
        from kvbench.registry import load_file_policy

        policy = load_file_policy(path, class_name).cls(**header.get("params", {}))
        hello = _describe(policy)
        wire.encode(hello, {})  # a parameter that is not JSON fails here, by name
    except BaseException as exc:
        wire.write(replies, _failure(exc), {})
        return
    wire.write(replies, hello, {})
    while True:
        try:
            header, tensors = wire.read(requests, MAX_REQUEST)
        except wire.WireError:
            return  # the parent closed the channel
        if header.get("op") == "close":
            return
        try:
            if header["op"] == "score":
                view = messages.eviction_view(header, tensors)
                scores = policy.score(view)
                if not isinstance(scores, torch.Tensor):
                    raise TypeError(f"score returned {type(scores).__name__}, not a Tensor")
                reply = messages.state_reply(view.state, scores)
            else:
                step = messages.step_view(header, tensors)
                policy.observe(step)
                reply = messages.state_reply(step.state)
            data = wire.encode(*reply)
        except BaseException as exc:
            data = wire.encode(_failure(exc), {})
        replies.write(data)
        replies.flush()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
