"""Retention telemetry: which positions the KV heads kept at an eviction event, reduced to a few numbers.

At every event the engine hands :class:`RetentionLog` the positions each layer's KV heads kept among the
candidates ([L, B, Hkv, K − B], the buffer excluded). The log keeps only the last event's kept positions per
batch row and the steps at which events fired; a sample's summary is read when it leaves the batch
(protocol.md, "Retention telemetry"). An event only gathers the kept positions; the summary (one count of
holders per position seen and a few reductions) is computed when a sample is read, so it is always on.

- prompt survival: per layer, the share of the prompt's positions held (kept or in the buffer) by at
  least one KV head, and by every KV head;
- cross-head coverage: per layer, |union over the KV heads of the kept positions| / (Hkv · (K − B)):
  1/Hkv when every head kept the same positions, 1 when no two heads share one;
- survival by age: the positions that have been candidates, [0, step − B), cut into AGE_BUCKETS equal
  buckets from oldest to newest; per bucket, the share of (position, KV head) pairs kept, averaged over
  layers (NaN for a bucket holding no position, which only a sequence shorter than AGE_BUCKETS has).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

import torch
from torch import Tensor

AGE_BUCKETS = 10


@dataclass(frozen=True)
class Retention:
    """One sample's retention at its last eviction event."""

    prompt_held_any: list[float]
    """Per layer: the share of prompt positions held by at least one KV head."""
    prompt_held_all: list[float]
    """Per layer: the share of prompt positions held by every KV head."""
    head_coverage: list[float]
    """Per layer: |union of the KV heads' kept positions| / (Hkv · (K − B))."""
    kept_by_age: list[float]
    """Per age bucket, oldest first: the kept share of the candidates' (position, KV head) pairs."""

    def record_fields(self) -> dict[str, Any]:
        """The sample record's columns (kvbench.store.records.SampleRecord) holding this summary: its
        fields, which are named as those columns."""
        return asdict(self)


def summarize(kept: Tensor, step: int, prompt_len: int, buffer: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(prompt_any [B, L], prompt_all [B, L], coverage [B, L], by_age [B, AGE_BUCKETS]) of one event, from
    the kept candidate positions ``kept`` [L, B, Hkv, k] after ``step`` tokens with buffer ``buffer``."""
    layers, batch, heads, k = kept.shape
    span = step - buffer  # the positions that have been candidates: every kept one is below it
    flat = kept.reshape(layers, batch, heads * k)
    # how many KV heads hold each position (a head holds a position at most once): one scatter
    holders = torch.zeros(layers, batch, span, dtype=torch.int16, device=kept.device)
    holders.scatter_add_(-1, flat, torch.ones_like(flat, dtype=torch.int16))
    coverage = (holders > 0).sum(dim=-1) / (heads * k)
    prompt = holders[..., :prompt_len]
    in_buffer = max(0, prompt_len - span)  # prompt positions still in the buffer: held by every head
    share = max(prompt_len, 1)
    prompt_any = ((prompt > 0).sum(dim=-1) + in_buffer) / share
    prompt_all = ((prompt == heads).sum(dim=-1) + in_buffer) / share
    bucket = (flat * AGE_BUCKETS).div_(max(span, 1), rounding_mode="floor")
    counts = torch.zeros(layers, batch, AGE_BUCKETS, dtype=torch.float32, device=kept.device)
    counts.scatter_add_(-1, bucket, torch.ones_like(bucket, dtype=torch.float32))
    edges = [(a * span + AGE_BUCKETS - 1) // AGE_BUCKETS for a in range(AGE_BUCKETS + 1)]  # ceil(a·span/A)
    sizes = torch.tensor([hi - lo for lo, hi in pairwise(edges)], dtype=torch.float32)
    by_age = counts.mean(dim=0) / (heads * sizes.to(kept.device))  # 0/0: a bucket without positions
    return prompt_any.T.float(), prompt_all.T.float(), coverage.T.float(), by_age


class RetentionLog:
    """The last event's kept positions per batch row, summarized when a row is read, and the step of
    every event. Only the last event's summary is ever stored, so an event only keeps its positions
    (replacing the previous event's); the summary is computed once per event that is read."""

    def __init__(self, prompt_len: int, buffer: int) -> None:
        self.prompt_len = prompt_len
        self.buffer = buffer
        self.steps: list[int] = []
        """Tokens seen at each event, in order (every row of a batch evicts at the same steps)."""
        self._kept: list[Tensor] | None = None
        self._summary: tuple[Tensor, ...] | None = None

    def record(self, kept: Sequence[Tensor], step: int) -> None:
        """One event: ``kept[l]`` [B, Hkv, K − B] the positions layer l's KV heads kept (tensors of the
        event's own, which later events do not change)."""
        self.steps.append(step)
        self._kept = list(kept)
        self._summary = None

    def select_rows(self, rows: Sequence[int]) -> None:
        """Rows ``rows`` stay in the batch, as the cache's."""
        if self._kept is not None:
            index = torch.tensor(list(rows), dtype=torch.long, device=self._kept[0].device)
            self._kept = [t.index_select(0, index) for t in self._kept]
            self._summary = None

    def row(self, index: int) -> Retention | None:
        """Batch row ``index``'s summary at the last event; None before the first."""
        if self._kept is None:
            return None
        if self._summary is None:
            self._summary = summarize(torch.stack(self._kept), self.steps[-1], self.prompt_len, self.buffer)
        return Retention(*(t[index].tolist() for t in self._summary))  # summarize returns the fields in order

    def events_between(self, after: int, until: int) -> int:
        """Events at which position ``after`` was a candidate (out of the buffer) and which a token at
        position ``until`` attends after: the evictions a fact at ``after`` lived through before it."""
        return sum(1 for step in self.steps if step - self.buffer > after and step <= until)
