"""Scoring probe problems with the transformers backend, teacher-forced in schedule-aligned chunks."""

from __future__ import annotations

import time
from typing import Any

import torch

from kvbench.adapters.hf.models import LoadedModel
from kvbench.adapters.hf.teacher import teacher_force
from kvbench.engine import PinnedSlots
from kvbench.probes.problems import ProbeProblem, fidelity_problem, needle_problem
from kvbench.runner.plan import Cell
from kvbench.runner.store import sample_row


def probe_problems(cell: Cell, loaded: LoadedModel) -> list[ProbeProblem]:
    source = cell.task.source

    def count(text: str) -> int:
        return len(loaded.tokenizer(text, add_special_tokens=False)["input_ids"])

    total = source.problems if cell.limit is None else min(source.problems, cell.limit)
    if source.probe == "fidelity":
        return [
            fidelity_problem(i, seed=source.seed, length=source.length, count_tokens=count)
            for i in range(total)
        ]
    return [
        needle_problem(
            source.probe, i, seed=source.seed, length=source.length, depth=source.depth, count_tokens=count
        )
        for i in range(total)
    ]


def encode_problem(
    problem: ProbeProblem, loaded: LoadedModel
) -> tuple[list[int], list[int], dict[str, list[int]]]:
    """Prompt ids, continuation ids, and the continuation offsets of each role's tokens."""
    prompt = loaded.prompt_ids(problem.stub)
    continuation: list[int] = []
    where: dict[str, list[int]] = {}
    for role, ids in problem.token_pieces(
        lambda t: loaded.tokenizer(t, add_special_tokens=False)["input_ids"]
    ):
        where.setdefault(role, []).extend(range(len(continuation), len(continuation) + len(ids)))
        continuation.extend(ids)
    return prompt, continuation, where


def score_probe(
    cell: Cell, loaded: LoadedModel, problem: ProbeProblem, seeds: list[int], *, run_id: str, calibration: Any
) -> list[dict[str, Any]]:
    started = time.perf_counter()
    prompt, continuation, where = encode_problem(problem, loaded)
    source = cell.task.source
    pinned = None
    if source.pin_heads is not None:
        heads = torch.arange(loaded.facts.num_kv_heads) < source.pin_heads
        positions = torch.tensor([len(prompt) + i for i in where["needle"]])
        pinned = PinnedSlots(positions, heads)
    fidelity = source.probe == "fidelity"
    result = teacher_force(
        loaded,
        prompt,
        continuation,
        cell.policy,
        cell.schedule(),
        row_seeds=seeds,
        calibration=calibration,
        reference=fidelity,
        refuse_capped_prompt=True,
        pinned=pinned,
    )
    seconds = (time.perf_counter() - started) / len(seeds)
    rows = []
    for i, seed in enumerate(seeds):
        if fidelity:
            # the predictions a cache could change: those made after the first event (at K + B slots)
            scored = slice(max(cell.budget + cell.protocol.buffer - len(prompt) + 1, 0), None)
            agreement = result.top1_agrees_with_full[i, scored].float()
            kl = result.kl_to_full[i, scored]
            metric, correct = float(agreement.mean()) if agreement.numel() else 1.0, None
            secondary = {
                "kl_to_full": float(kl.mean()) if kl.numel() else 0.0,
                "scored_tokens": agreement.numel(),
            }
        else:
            answer = torch.tensor(where["answer"])
            exact = bool(result.greedy_match[i, answer].all())
            metric, correct = float(exact), exact
            secondary = {
                "answer_logprob": float(result.logprobs[i, answer].sum()),
                "answer_tokens": len(answer),
                "depth": source.depth,
            }
        secondary["eviction_seconds"] = result.eviction_seconds / len(seeds)
        rows.append(
            sample_row(
                run_id,
                cell.task.name,
                problem.problem_id,
                i,
                seed,
                metric=metric,
                correct=correct,
                strict_correct=correct,
                finish_reason="teacher-forced",
                generated_tokens=len(continuation),
                evictions=result.eviction_events,
                secondary=secondary,
                output=None,
                wall_seconds=seconds,
            )
        )
    return rows
