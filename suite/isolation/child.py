"""The isolated scorer's process: import the scorer file, then answer the parent's requests in turn.

Run by kvbench.isolation.host inside the boundary as ``python -I -m kvbench.isolation.child FILE CLASS``.
Requests come on stdin; replies go out on the stdout this process found at start, which is then pointed at
stderr so that the scorer's prints cannot corrupt the replies. The first frame, sent before the scorer's
file is read, says the process has started. Whatever the scorer raises (SystemExit, KeyboardInterrupt and
MemoryError included) is sent back by name, with the traceback lines of the scorer's own file only; the
parent decides what it means.
"""

from __future__ import annotations

import itertools
import sys
import traceback
from typing import Any

import torch

from kvbench.isolation import messages, serving, wire
from kvbench.registry import load_file_policy


def _failure(exc: BaseException, path: str) -> dict[str, Any]:
    """The failure's reply: its type, message and errno, and the frames of the scorer's file ``path``
    (kvbench's own frames, this harness's included, say nothing about the scorer's code)."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and cause not in chain:  # an import error arrives wrapped (registry's SpecError)
        chain.insert(0, cause)
        cause = cause.__cause__ or cause.__context__
    frames = [f for e in chain for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
    return {
        "ok": False,
        "error": type(exc).__name__,
        "message": str(exc)[:2000],
        "errno": exc.errno if isinstance(exc, OSError) else None,
        "trace": "".join(traceback.format_list(frames))[-4000:],
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
    }


def serve(path: str, class_name: str) -> None:
    """One instance of the scorer's class per hello (each run that uses this process makes its own, with
    its parameters); a request names the instance it is for."""
    instances: dict[int, Any] = {}
    numbers = itertools.count()

    def hello(header: dict[str, Any]) -> dict[str, Any]:
        policy = load_file_policy(path, class_name).cls(**header.get("params", {}))
        number = next(numbers)
        instances[number] = policy
        return {**_describe(policy), "instance": number}

    def answer(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> wire.Frame:
        if header["op"] == "hello":
            return hello(header), {}
        if header["op"] == "drop":
            instances.pop(int(header["instance"]), None)
            return {"ok": True}, {}
        policy = instances[int(header["instance"])]
        if header["op"] == "score":
            view = messages.eviction_view(header, tensors)
            scores = policy.score(view)
            if not isinstance(scores, torch.Tensor):
                raise TypeError(f"score returned {type(scores).__name__}, not a Tensor")
            return messages.state_reply(view.state, scores, view.tensors_read())
        step = messages.step_view(header, tensors)
        policy.observe(step)
        return messages.state_reply(step.state)

    serving.serve(hello, answer, failure=lambda exc: _failure(exc, path), started=True)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
