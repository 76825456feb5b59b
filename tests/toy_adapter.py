"""A second, minimal adapter, used only in the tests: it proves the runner needs nothing of a backend but
the interface in kvbench.adapters.base.

The "model" is a toy with a byte vocabulary: the engine's synthetic backend supplies random keys, values
and attention, and the next token is predicted by a bigram model counted over the tokens the cache still
holds (averaged over KV heads). So what a policy evicts changes what the toy
predicts, as in a real model, and the full cache is the reference. It imports neither torch's models
nor transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from synthetic_adapter import SyntheticBackend, synthetic_model
from torch import Tensor

from kvbench.adapters.base import Capabilities, Generation, Sample, Sampling, TeacherForced, Watch
from kvbench.core.contract import Policy
from kvbench.core.engine import PinnedSlots
from kvbench.core.schedule import Schedule
from kvbench.core.seeding import generator
from kvbench.registry import make_policy

VOCABULARY = 256
SHARPNESS = 8.0


class _Stream(SyntheticBackend):
    """The synthetic backend, remembering which token id sits at every position of every row."""

    def __init__(self, prompt_ids: Sequence[int], rows: int, **kwargs: Any) -> None:
        self.ids = torch.tensor(list(prompt_ids), dtype=torch.long).expand(rows, -1).clone()
        super().__init__(prompt_len=len(prompt_ids), **kwargs)

    def feed(self, tokens: Tensor) -> None:
        """One token per row [B]: appended, then an eviction if the schedule says so."""
        self.ids = torch.cat([self.ids, tokens.view(-1, 1)], dim=1)
        self.step()

    def logprobs(self) -> Tensor:
        """[B, V] the toy's next-token log-probabilities: a bigram model counted over the token pairs whose
        second token the cache still holds (averaged over KV heads), conditioned on the last token."""
        positions = self.layers[0].positions.clamp(min=1)  # [B, Hkv, S]
        flat = positions.flatten(1)
        held = self.ids.gather(1, flat).view_as(positions)
        before = self.ids.gather(1, flat - 1).view_as(positions)
        follows = (before == self.ids[:, -1].view(-1, 1, 1)).float()
        counts = torch.zeros(*positions.shape[:2], VOCABULARY).scatter_add_(-1, held, follows)
        share = (counts / counts.sum(-1, keepdim=True).clamp(min=1)).mean(dim=1)
        return (SHARPNESS * share).log_softmax(dim=-1)


class ToyBackend:
    def __init__(self) -> None:
        self.facts = synthetic_model(layers=2, q_heads=4, kv_heads=2, head_dim=16)

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def prompt_ids(self, user_text: str) -> list[int]:
        return self.encode(f"user: {user_text}\nassistant: ")

    def _stream(self, prompt_ids, policy, schedule, seeds, calibration, pinned) -> _Stream:
        return _Stream(
            prompt_ids,
            len(seeds),
            policy=policy,
            schedule=schedule,
            model=self.facts,
            row_seeds=seeds,
            calibration=calibration,
            pinned=pinned,
        )

    def teacher_force(
        self,
        prompt_ids: Sequence[int],
        continuation_ids: Sequence[int],
        policy: Policy,
        schedule: Schedule,
        *,
        row_seeds: Sequence[int],
        calibration: Any = None,
        reference: bool = False,
        refuse_capped_prompt: bool = False,
        pinned: PinnedSlots | None = None,
        watch: Watch | None = None,
    ) -> TeacherForced:
        arms = [self._stream(prompt_ids, policy, schedule, row_seeds, calibration, pinned)]
        if reference:
            arms.append(self._stream(prompt_ids, make_policy("full"), schedule, row_seeds, None, None))
        predictions: list[list[Tensor]] = [[] for _ in arms]
        survival = None
        for t, token in enumerate(continuation_ids):
            if watch is not None and t == watch.at:  # the cache the watched token attends to
                watched = torch.tensor(watch.positions)
                held = [torch.isin(kv.positions, watched).sum(-1) / len(watched) for kv in arms[0].layers]
                survival = torch.stack(held, dim=1).float()
            for stream, outputs in zip(arms, predictions, strict=True):
                outputs.append(stream.logprobs())
                if t < len(continuation_ids) - 1:
                    stream.feed(torch.full((len(row_seeds),), token))
        mine = torch.stack(predictions[0], dim=1)  # [k, T, V]
        targets = torch.tensor(list(continuation_ids)).expand(len(row_seeds), -1)
        kl = agree = None
        if reference:
            full = torch.stack(predictions[1], dim=1)
            kl = (full.exp() * (full - mine)).sum(dim=-1)
            agree = full.argmax(dim=-1) == mine.argmax(dim=-1)
        stats = arms[0].evictor.stats
        return TeacherForced(
            logprobs=mine.gather(-1, targets.unsqueeze(-1)).squeeze(-1),
            greedy_match=mine.argmax(dim=-1) == targets,
            kl_to_full=kl,
            top1_agrees_with_full=agree,
            eviction_events=stats.events,
            eviction_seconds=stats.seconds,
            peak_kv_bytes=0,
            survival=survival,
        )

    def generate(
        self,
        prompt_ids: Sequence[int],
        policy: Policy,
        schedule: Schedule,
        *,
        sample_seeds: Sequence[int],
        sampling: Sampling,
        max_new_tokens: int,
        calibration: Any = None,
        refuse_capped_prompt: bool = False,
        ignore_stop: bool = False,
        stop_strings: Sequence[str] = (),
    ) -> Generation:
        stream = self._stream(prompt_ids, policy, schedule, sample_seeds, calibration, None)
        generators = [generator(seed) for seed in sample_seeds]
        tokens = []
        for _ in range(max_new_tokens):
            probs = (stream.logprobs() / max(sampling.temperature, 1e-3)).softmax(dim=-1)
            drawn = torch.cat(
                [torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators, strict=True)]
            )
            tokens.append(drawn)
            stream.feed(drawn)
        rows = torch.stack(tokens, dim=1).tolist()
        events = stream.evictor.stats.events
        samples = [Sample(r, bytes(r).decode(errors="replace"), "length", events) for r in rows]
        return Generation(samples, len(prompt_ids), events, stream.evictor.stats.seconds, 0.0, 0,
                          stream.evictor.stats.protected)  # fmt: skip

    def calibrate(self) -> Any:
        raise NotImplementedError("the toy adapter does not provide calibration")


class ToyAdapter:
    name = "toy"

    def capabilities(self) -> Capabilities:
        return Capabilities(
            needs=frozenset({"step_attention", "rope"}),
            devices=("cpu",),
            dtypes=("float32",),
            attentions=("toy",),
        )

    def identity(self) -> dict[str, str]:
        return {}

    def load(self, spec: Any, *, device: str, attention: str, progress: bool = True) -> ToyBackend:
        return ToyBackend()
