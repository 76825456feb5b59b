"""``--policy kvpress:PressName[:key=value,...]``: a kvpress ScorerPress as a kvbench Policy.

The press lives in a child process under the kvpress environment's interpreter (kvbench.kvpress.child);
this side sends each eviction event's view over kvbench.isolation's wire and takes back the scores. The
engine, the null and the full cache run here, in kvbench's process, which never imports kvpress.
"""

from __future__ import annotations

import collections
import subprocess
import threading
import weakref
from typing import Any

from torch import Tensor

from kvbench.core.contract import EvictionView, Policy
from kvbench.errors import ScorerError, SpecError
from kvbench.isolation import messages, serving, wire
from kvbench.isolation.arena import Arena
from kvbench.kvpress.catalog import PREFIX, SUPPORTED, policy_name, press_of, reason
from kvbench.kvpress.environment import child_environment, installed_presses, require
from kvbench.registry import parse_policy_arg

REPLY_BYTES = 1 << 32
NEEDS = {"cache": frozenset(), "window": frozenset({"queries", "rope"}), "prerope_keys": frozenset({"rope"})}


class _Child:
    """The press's process: one request, then its reply, in turn."""

    def __init__(self, press: str) -> None:
        self.process = subprocess.Popen(
            [str(require()), "-m", "kvbench.kvpress.child", "serve", press],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_environment(),
        )
        self.log: collections.deque[str] = collections.deque(maxlen=40)
        # a function's thread, not a method's: it must not be what holds this object when the child dies
        # at interpreter exit (kvbench.isolation.host's _drain says why)
        threading.Thread(target=_drain, args=(self.process.stderr, self.log), daemon=True).start()
        self.arena = Arena()  # an event's keys and values cross in a mapped file, not the pipe
        self._finalizer = weakref.finalize(self, _stop, self.process, self.arena)

    def call(self, header: dict[str, Any], tensors: dict[str, Tensor], where: str) -> wire.Frame:
        assert self.process.stdin is not None and self.process.stdout is not None
        layout, tensors = self.arena.place(tensors)
        if layout:
            header = {**header, "arena": {**layout, "folder": str(self.arena.folder)}}
        try:
            self.process.stdin.write(wire.encode(header, tensors))
            self.process.stdin.flush()
            reply, out = wire.read(self.process.stdout, REPLY_BYTES)
        except (wire.WireError, OSError) as exc:
            self.close()
            tail = " | ".join(list(self.log)[-5:])
            raise ScorerError(
                f"{where}: the kvpress process broke off ({exc}); its last words: {tail}"
            ) from None
        if not reply.get("ok"):
            raise serving.raised(where, reply)
        return reply, out

    def close(self) -> None:
        self._finalizer()


def _drain(stream: Any, log: collections.deque[str]) -> None:
    for line in stream:
        log.append(line.decode(errors="replace").rstrip())


def _stop(process: subprocess.Popen, arena: Arena) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()
    arena.close()


class KvpressPolicy(Policy):
    """A kvpress ScorerPress scoring the candidates at each event; the engine owns everything else."""

    def __init__(self, press: str, params: dict[str, Any]) -> None:
        why = reason(press)
        if why is not None:
            version, found = installed_presses()
            if press not in found:
                raise SpecError(
                    f"--policy {PREFIX}{press}: kvpress {version} has no ScorerPress {press!r}; "
                    f"its presses: {', '.join(found)} (`kvbench list policies` marks which run)"
                )
            raise SpecError(f"--policy {PREFIX}{press}: kvbench cannot run this press: {why}")
        # a recorded identity (a submission's, say) names the kvpress version it was scored with
        recorded = params.get("kvpress_version")
        self.press, self.raw = press, {k: v for k, v in params.items() if k != "kvpress_version"}
        self.child: _Child | None = None
        hello = self._start()
        if recorded is not None and str(recorded) != hello["kvpress_version"]:
            self.close()
            raise SpecError(
                f"--policy {PREFIX}{press}: recorded with kvpress {recorded}, but the kvpress venv has "
                f"{hello['kvpress_version']}; rebuild it: "
                f"`make kvpress-venv KVPRESS_PACKAGE=kvpress=={recorded}`"
            )
        feed = hello["feed"]  # a wrapping press is fed as the press it wraps
        reads_output = frozenset({"output_projection"}) if SUPPORTED[press].output_projection else frozenset()
        vars(self).update(
            name=policy_name(press),
            needs=NEEDS[feed] | reads_output,
            description=f"kvpress {hello['kvpress_version']} {press}",
        )
        self.hello = hello
        self.shipped_documentation = {
            "name": self.name,
            "summary": str(hello.get("summary", "")),
            "module_doc": f"NVIDIA kvpress {hello['kvpress_version']}, scored in kvpress's own environment "
            f"(transformers {hello['transformers_version']}) and fed as {feed!r} (kvbench.kvpress.catalog)",
            "module": f"{hello['module']} (kvpress {hello['kvpress_version']})",
            "class": press,
            "source_sha256": None,
            "needs": sorted(self.needs),
            "origin": "kvpress",
        }

    def _start(self) -> dict[str, Any]:
        self.child = _Child(self.press)
        self.sent_output_projections: set[tuple[str, int]] = set()
        try:
            hello, _ = self.child.call({"op": "hello", "params": self.raw}, {}, f"{PREFIX}{self.press}")
        except ScorerError as exc:
            self.child.close()
            raise SpecError(f"--policy {PREFIX}{self.press}: {exc}") from None
        return hello

    @property
    def query_window(self) -> int:
        """The recent queries the press reads as hidden states (kvbench.kvpress.catalog)."""
        return int(self.hello["query_window"])

    def params(self) -> dict[str, Any]:
        """The press's parameters, defaults filled in, and the kvpress version: the run's identity."""
        return {**self.hello["params"], "kvpress_version": self.hello["kvpress_version"]}

    def score(self, view: EvictionView) -> Tensor:
        if self.child is None:  # unpickled in another process (a Ray worker): start it there
            self._start()
        assert self.child is not None
        where = f"policy {self.name!r} at layer {view.layer}, eviction event {view.event}"
        header, tensors = messages.eviction_request(view)
        if view.output_projection is not None:  # W_O crosses once per layer; the child keeps it
            layer = (view.model.name, view.layer)
            if layer in self.sent_output_projections:
                del tensors["output_projection"]
            self.sent_output_projections.add(layer)
        _, tensors = self.child.call(header, tensors, where)
        if "scores" not in tensors:
            raise ScorerError(f"{where}: the kvpress process returned no scores")
        return tensors["scores"].to(view.keys.device)

    def close(self) -> None:
        if self.child is not None:
            self.child.close()

    def __getstate__(self) -> dict[str, Any]:
        return {**vars(self), "child": None}


def kvpress_policy(text: str) -> KvpressPolicy:
    """The policy of ``kvpress:PressName[:key=value,...]``, or of a recorded name and parameters
    (``kvpress-knorm[:key=value,...]``)."""
    press = press_of(text)
    if not press:
        raise SpecError(
            f"--policy {text!r}: name a press, as in kvpress:KnormPress or kvpress:SnapKVPress:window_size=32"
        )
    rest = text[len(PREFIX) + len(press) :] if text.startswith(PREFIX) else text.partition(":")[2]
    _, _, params = parse_policy_arg(f"{press}:{rest.removeprefix(':')}")
    return KvpressPolicy(press, params)
