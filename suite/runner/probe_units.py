"""Scoring probe problems with the transformers backend, teacher-forced in schedule-aligned chunks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from kvbench.adapters.base import Backend, TeacherForced, Watch
from kvbench.core.engine import PinnedSlots
from kvbench.errors import SpecError
from kvbench.graders.registry import Graders
from kvbench.probes.problems import ProbeProblem, fidelity_problem, needle_problem
from kvbench.runner.cell import Cell
from kvbench.runner.sources import TaskSource, unit_fields
from kvbench.specs.task import TaskSpec
from kvbench.store.records import SampleRecord


class ProbeTaskSource(TaskSource[ProbeProblem]):
    """Generated probes (passkey, planted fact, fidelity), teacher-forced; N_avg is their trace length."""

    teacher_forced = True

    def made_to_order(self, task: TaskSpec) -> int | None:
        return task.probe.problems

    measured_n_avg = False

    def problems(
        self,
        task: TaskSpec,
        backend: Backend | None,
        limit: int | None,
        data: Path | None,
        fingerprint: str | None,
    ) -> list[ProbeProblem]:
        if backend is None:
            raise TypeError(f"task {task.name!r}: probes are laid out in tokens, so they need a backend")
        try:
            return make_probe_problems(task.probe, limit, backend.encode)
        except SpecError as exc:  # the probe's layout on this model's tokenizer: named with its task
            raise SpecError(f"task {task.name!r}: {exc}") from None

    def score(
        self,
        cell: Cell,
        backend: Backend,
        problem: ProbeProblem,
        seeds: list[int],
        calibration: Any,
        graders: Graders,
        batch: int | None = None,
    ) -> list[SampleRecord]:
        started = time.perf_counter()
        prompt, continuation, where = encode_problem(problem, backend)
        source = cell.task.probe
        needle = tuple(len(prompt) + i for i in where.get("needle", ()))
        pinned = None
        if source.pin_heads is not None:
            heads = torch.arange(backend.facts.num_kv_heads) < source.pin_heads
            pinned = PinnedSlots(torch.tensor(needle), heads)
        fidelity = source.probe == "fidelity"
        # the needle's survival is read in the cache the query's first token attends to
        watch = None if fidelity else Watch(needle, where["query"][0])
        result = backend.teacher_force(
            prompt,
            continuation,
            cell.policy,
            cell.schedule(),
            row_seeds=seeds,
            calibration=calibration,
            reference=fidelity,
            refuse_capped_prompt=True,
            pinned=pinned,
            watch=watch,
        )
        seconds = (time.perf_counter() - started) / len(seeds)
        shared = unit_fields(cell, problem.problem_id, result, seconds, len(seeds))
        # the predictions a cache could change: those made after the first event (at K + B slots)
        scored = slice(max(cell.budget + cell.protocol.buffer - len(prompt) + 1, 0), None)
        rows = []
        for i, seed in enumerate(seeds):
            if fidelity:
                metric, correct, measured, secondary = _fidelity_measures(result, i, scored)
            else:
                metric, correct, measured, secondary = _needle_measures(
                    result, i, where["answer"], problem.depth
                )
            retention = result.retention[i] if result.retention is not None else None
            if retention is not None:
                measured.update(retention.record_fields())
            rows.append(
                SampleRecord(
                    **shared,
                    sample=i,
                    seed=seed,
                    metric=metric,
                    correct=correct,
                    strict_correct=correct,
                    finish_reason="teacher-forced",
                    generated_tokens=len(continuation),
                    evictions=result.eviction_events,
                    secondary=secondary,
                    output=None,
                    **measured,
                )
            )
        return rows


Measures = tuple[float, bool | None, dict[str, Any], dict[str, Any]]
"""A probe row's metric, correctness, measured fields and secondary fields."""


def _fidelity_measures(result: TeacherForced, row: int, scored: slice) -> Measures:
    """A fidelity row: its agreement with the full cache's next-token choices and the KL to them, over the
    ``scored`` predictions."""
    kl_to_full, agrees = result.against_full()
    agreement, kl = agrees[row, scored].float(), kl_to_full[row, scored]
    metric = float(agreement.mean()) if agreement.numel() else 1.0
    measured = {"kl_to_full": float(kl.mean()) if kl.numel() else 0.0}
    return metric, None, measured, {"scored_tokens": agreement.numel()}


def _needle_measures(result: TeacherForced, row: int, answer_at: list[int], depth: int) -> Measures:
    """A needle row: whether it recalls the answer (continuation tokens ``answer_at``) exactly, its
    log-probability, and how much of the needle its cache held when the question came."""
    answer = torch.tensor(answer_at)
    exact = bool(result.greedy_match[row, answer].all())
    measured: dict[str, Any] = {"answer_logprob": float(result.logprobs[row, answer].sum())}
    if result.survival is not None:
        held = result.survival[row]  # [L, Hkv]
        measured["needle_survival"] = float(held.mean())
        measured["needle_whole_layers"] = float((held == 1.0).any(dim=-1).float().mean())
        measured["needle_survival_by_head"] = held.flatten().tolist()
    if result.high_precision_survival is not None:
        measured["needle_high_precision"] = float(result.high_precision_survival[row].mean())
    measured["needle_events"] = result.watched_events
    return float(exact), exact, measured, {"answer_tokens": len(answer), "depth": depth}


def make_probe_problems(source: Any, limit: int | None, encode: Any) -> list[ProbeProblem]:
    """A probe source's problems, their lengths counted with ``encode``: ``limit`` of them, or the source's
    ``problems`` without one. Problem i is seeded by its index alone, so a larger ``--limit`` adds problems
    and keeps the first ones as they were."""

    def count(text: str) -> int:
        return len(encode(text))

    total = source.problems if limit is None else limit
    kind = source.probe
    if kind == "fidelity":
        return [
            fidelity_problem(i, seed=source.seed, length=source.length, count_tokens=count)
            for i in range(total)
        ]
    return [
        needle_problem(
            kind, i, seed=source.seed, length=source.length, depth=source.depth_of(i), count_tokens=count
        )
        for i in range(total)
    ]


def encode_problem(
    problem: ProbeProblem, backend: Backend
) -> tuple[list[int], list[int], dict[str, list[int]]]:
    """Prompt ids, continuation ids, and the continuation offsets of each role's tokens."""
    prompt = problem.encoded(backend)
    continuation: list[int] = []
    where: dict[str, list[int]] = {}
    for role, ids in problem.token_pieces(backend.encode):
        where.setdefault(role, []).extend(range(len(continuation), len(continuation) + len(ids)))
        continuation.extend(ids)
    return prompt, continuation, where
