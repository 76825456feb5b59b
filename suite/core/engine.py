"""The eviction engine: backend-agnostic torch code that applies one policy under one schedule.

A backend (the transformers cache, the vLLM connector, the synthetic test backend) keeps one
:class:`~kvbench.core.layer_kv.LayerKV` per layer and calls :meth:`Evictor.evict` whenever
``schedule.due(length)``. The engine builds each layer's :class:`EvictionView`, checks the policy's
scores, gives protected slots +inf, keeps the top K − B candidates per KV head, appends the buffer and
compacts keys, values, positions and slot state.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from kvbench.core.contract import EvictionView, ModelFacts, Policy, StepView
from kvbench.core.mixed_kv import Slots
from kvbench.core.retention import RetentionLog
from kvbench.core.schedule import ProtectedPrefix, Schedule
from kvbench.core.seeding import eviction_seed, generator
from kvbench.errors import BudgetError, CapabilityError, KvbenchError, PolicyOutputError, ScorerError


@dataclass(frozen=True)
class PinnedSlots:
    """Extra protection for an ablation: these positions are kept in the KV heads marked in ``heads``."""

    positions: Tensor
    """[P] int64 absolute positions."""
    heads: Tensor
    """[Hkv] bool: the KV heads (of every layer) in which the positions are pinned."""


@dataclass
class EvictionStats:
    """What the engine measured for one batch; recorded with the results."""

    protected: ProtectedPrefix
    events: int = 0
    seconds: float = 0.0


@contextlib.contextmanager
def _scorer_call(where: str, given: Sequence[Tensor]) -> Iterator[None]:
    """A call into a scorer's code: what it raises is named by its policy, layer and event, and the tensors
    it is given stay as they were.

    Tensors made under torch.inference_mode (the adapters decode in it) cannot change in place outside it,
    so the call runs outside it and an attempt raises; other tensors' version counters must not move.
    KeyboardInterrupt stays one (a user's Ctrl-C and a scorer's look alike), with the place noted.
    """
    tracked = [t for t in given if not t.is_inference()]
    versions = [t._version for t in tracked]
    try:
        with torch.inference_mode(False), torch.no_grad():
            yield
    except KvbenchError:
        raise
    except KeyboardInterrupt as exc:
        exc.add_note(f"in {where}")
        raise
    except RuntimeError as exc:
        if "Inplace update to inference tensor" in str(exc):
            raise PolicyOutputError(f"{where} {_IN_PLACE}") from exc
        raise ScorerError(f"{where} raised {type(exc).__name__}: {exc}") from exc
    except (Exception, MemoryError, SystemExit) as exc:
        raise ScorerError(f"{where} raised {type(exc).__name__}: {exc}") from exc
    if [t._version for t in tracked] != versions:
        raise PolicyOutputError(f"{where} {_IN_PLACE}")


_IN_PLACE = (
    "changed a tensor it was given in place (the cache's keys, values or positions, the protection, the "
    "queries or attention, or a state slot the engine extended): compute on copies (x.clone()) and replace "
    "state with set_slot / set_row"
)


class Evictor:
    """Applies ``policy`` under ``schedule`` to the layers of one batch of sequences sharing a prompt.

    ``row_seeds`` holds one seed per batch row; every random draw a policy makes at layer l and event e
    for row r comes from a generator seeded with ``eviction_seed(row_seeds[r], l, e)``.
    """

    def __init__(
        self,
        policy: Policy,
        schedule: Schedule,
        model: ModelFacts,
        *,
        prompt_len: int,
        row_seeds: Sequence[int],
        calibration: Any = None,
        pinned: PinnedSlots | None = None,
        telemetry: bool = True,
    ) -> None:
        """``telemetry``: summarize what each event kept (kvbench.core.retention); off only to measure
        its cost."""
        if "calibration" in policy.needs and calibration is None:
            raise CapabilityError(
                f"policy {policy.name!r} needs calibration statistics for model {model.name!r}: "
                f"run `kvbench calibrate --model {model.name}` first"
            )
        if "rope" in policy.needs and model.rope_inv_freq is None:
            raise CapabilityError(
                f"policy {policy.name!r} needs RoPE frequencies, which model {model.name!r} lacks"
            )
        if "output_projection" in policy.needs and model.output_projections is None:
            raise CapabilityError(
                f"policy {policy.name!r} needs the layers' output projection weights, which the backend "
                f"did not give for model {model.name!r}"
            )
        self.policy = policy
        self.schedule = schedule
        self.model = model
        self.prompt_len = prompt_len
        self.row_seeds = list(row_seeds)
        self.calibration = calibration
        self.pinned = pinned
        self.stats = EvictionStats(protected=schedule.protected_prefix(prompt_len))
        self.retention = RetentionLog(prompt_len, schedule.buffer) if telemetry else None
        if pinned is not None and self.stats.protected.count + len(pinned.positions) >= schedule.keep:
            raise BudgetError(
                f"{len(pinned.positions)} pinned and {self.stats.protected.count} protected slots leave the "
                f"policy nothing to choose among K − B = {schedule.keep}: raise the budget"
            )

    def due(self, length: int) -> bool:
        return self.policy.evicts and self.schedule.due(length)

    def select_rows(self, rows: Sequence[int]) -> None:
        """Rows ``rows`` stay in the batch (the others finished); their seeds keep their meaning."""
        self.row_seeds = [self.row_seeds[r] for r in rows]
        if self.retention is not None:
            self.retention.select_rows(rows)

    def observe(self, layer: int, layer_kv: Slots, attention: Tensor, step: int) -> None:
        """Pass one layer's step attention [B, Hq, q, S] to a policy that asked for it."""
        if "step_attention" not in self.policy.needs:
            return
        view = StepView(attention, layer_kv.positions, layer, step, self.model, layer_kv.state)
        with _scorer_call(f"policy {self.policy.name!r} observing layer {layer} at step {step}", [attention]):
            self.policy.observe(view)

    def evict(
        self,
        layers: Sequence[Slots],
        *,
        step: int,
        queries: Sequence[Tensor | None] | None = None,
    ) -> list[Slots]:
        """Run one eviction event on every layer of the model, ``layers`` in layer order; return the
        compacted layers. The layers given are given up: a LayerKV that owns its buffers may be compacted
        into them and returned itself.

        ``queries[i]`` is layer i's window of recent post-RoPE queries [B, Hq, W, D] (or None when the
        policy does not need them).
        """
        started = time.perf_counter()
        if "queries" in self.policy.needs and (queries is None or any(q is None for q in queries)):
            raise CapabilityError(f"policy {self.policy.name!r} needs recent queries; the backend gave none")
        event = self.stats.events
        scores = [
            self._layer_scores(kv, layer, event, step, queries[layer] if queries is not None else None)
            for layer, kv in enumerate(layers)
        ]
        if self.policy.layer_reduce == "mean":
            shared = torch.stack(scores).mean(dim=0)
            scores = [shared] * len(layers)
        indices = [self._keep_index(kv, s) for kv, s in zip(layers, scores, strict=True)]
        if self.retention is not None:
            keep = self.schedule.keep
            kept = [
                kv.positions.gather(2, index[..., :keep]) for kv, index in zip(layers, indices, strict=True)
            ]
            self.retention.record(kept, step)
        # the layers are given up: on the CPU each compacts into its own buffers (kvbench.core.layer_kv)
        compacted = [
            kv.compacted(index, self.schedule.buffer, reuse=True)
            for kv, index in zip(layers, indices, strict=True)
        ]
        self.stats.events += 1
        self.stats.seconds += time.perf_counter() - started
        return compacted

    # -- internals --------------------------------------------------------------------------------
    def _layer_scores(self, kv: Slots, layer: int, event: int, step: int, queries: Tensor | None) -> Tensor:
        n = kv.length - self.schedule.buffer
        positions = kv.positions[:, :, :n]
        protected = positions < self.stats.protected.count
        if self.pinned is not None:
            pinned = torch.isin(positions, self.pinned.positions.to(positions.device))
            protected = protected | (pinned & self.pinned.heads.to(positions.device).view(1, -1, 1))
        view = EvictionView(
            keys=kv.keys[:, :, :n],
            values=kv.values[:, :, :n],
            positions=positions,
            protected=protected,
            layer=layer,
            event=event,
            step=step,
            prompt_len=self.prompt_len,
            budget=self.schedule.budget,
            keep=self.schedule.keep,
            model=self.model,
            state=kv.state,
            rngs=tuple(generator(eviction_seed(s, layer, event), kv.keys.device) for s in self.row_seeds),
            recent_queries=queries,
            calibration=self.calibration,
            output_projection=self._output_projection(layer),
        )
        where = f"policy {self.policy.name!r} at layer {layer}, eviction event {event}"
        given = [view.keys, view.values, view.positions, view.protected]
        with _scorer_call(where, given + ([queries] if queries is not None else [])):
            scores = self.policy.score(view)
        self._check(scores, view, where)
        # Ranked in the scores' own dtype (float64 scores that differ only past float32 stay apart). A
        # policy's own +inf (vase-attnv's reserve) ranks just below the protocol's protection.
        highest = torch.finfo(scores.dtype).max
        ranked = scores.nan_to_num(posinf=highest, neginf=float("-inf"))
        return ranked.masked_fill(protected, float("inf"))

    def _output_projection(self, layer: int) -> Tensor | None:
        if "output_projection" not in self.policy.needs or self.model.output_projections is None:
            return None
        return self.model.output_projections[layer]

    def _check(self, scores: object, view: EvictionView, where: str) -> None:
        expected = tuple(view.positions.shape)
        if not isinstance(scores, Tensor):
            raise PolicyOutputError(f"{where} returned {type(scores).__name__}; expected a Tensor {expected}")
        if tuple(scores.shape) != expected:
            raise PolicyOutputError(
                f"{where} returned scores of shape {tuple(scores.shape)}; expected [B, Hkv, n] = {expected}"
            )
        if scores.dtype not in (torch.float32, torch.float64):
            raise PolicyOutputError(
                f"{where} returned {scores.dtype} scores; return float32 (compute scores in fp32: "
                "low-precision scores tie and bias top-k)"
            )
        if scores.device != view.keys.device:
            raise PolicyOutputError(
                f"{where} returned scores on {scores.device}; the cache is on {view.keys.device}"
            )
        if torch.isnan(scores).any():
            bad = torch.isnan(scores).nonzero()[0].tolist()
            raise PolicyOutputError(f"{where} returned NaN scores (first at row, head, slot = {bad})")
        usable = ((scores > float("-inf")) | view.protected).sum(dim=-1)
        short = usable < view.keep
        if short.any():
            row, head = short.nonzero()[0].tolist()
            raise PolicyOutputError(
                f"{where}: row {row}, KV head {head} has {int(usable[row, head])} candidates with a score "
                f"above -inf, but K − B = {view.keep} must be kept; "
                "give -inf only to slots that must never be kept"
            )

    def _keep_index(self, kv: Slots, scores: Tensor) -> Tensor:
        """[B, Hkv, K] slot indices to keep: the top K − B candidates, then the buffer."""
        batch, heads, n = scores.shape
        keep = self.schedule.keep
        if self.schedule.order == "score":
            kept = torch.topk(scores, keep, dim=-1, sorted=True).indices
        elif n - keep < keep:
            # Usually only B of the K candidates go: finding the few lowest and keeping the rest in
            # slot order is cheaper than a top-(K − B) followed by a sort.
            dropped = torch.topk(scores, n - keep, dim=-1, largest=False, sorted=False).indices
            mask = torch.ones_like(scores, dtype=torch.bool).scatter_(-1, dropped, False)
            kept = mask.nonzero()[:, -1].view(batch, heads, keep)
        else:
            kept = torch.topk(scores, keep, dim=-1, sorted=False).indices.sort(dim=-1).values
        buffer = torch.arange(n, kv.length, device=kept.device).expand(batch, heads, -1)
        return torch.cat([kept, buffer], dim=-1)
