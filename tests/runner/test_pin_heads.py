"""The planted-fact pin_heads ablation end to end: a task YAML through `kvbench run` into DuckDB, against the
answer's log-probability computed here from one plain forward pass with an attention mask that simulates
StreamingLLM's cache (prompt protected, needle pinned or not, most recent tokens kept) step by step."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
import torch
from invoke import kvbench

from kvbench.adapters.hf.backend import HFBackend
from kvbench.adapters.hf.models import LoadedModel
from kvbench.runner.execute import cell_problems
from kvbench.runner.plan import RunRequest, plan
from kvbench.runner.probe_units import encode_problem

BUDGET, BUFFER = 256, 64  # protect-prompt's buffer; four events over this trace

TASK = """\
spec_version: 1
name: {name}
version: 1
description: planted-fact, short, with {pins} pinned KV heads
source: {{kind: probe, probe: planted-fact, problems: 1, length: 384, depth: 192, pin_heads: {pins}}}
metric: exact
samples: 1
"""


def visible(prompt_len: int, total: int, pinned: set[int]) -> torch.Tensor:
    """[total, total] bool: which positions each query sees when streaming evicts token by token."""
    keep = BUDGET - BUFFER
    mask = torch.zeros(total, total, dtype=torch.bool)
    for q in range(prompt_len):
        mask[q, : q + 1] = True
    cache = list(range(prompt_len))

    def evict_if_due() -> None:
        nonlocal cache
        if not (len(cache) > BUDGET and (len(cache) - BUDGET) % BUFFER == 0):
            return
        candidates, recent = cache[: len(cache) - BUFFER], cache[len(cache) - BUFFER :]
        forced = [p for p in candidates if p < prompt_len or p in pinned]
        others = [p for p in candidates if p not in forced]
        newest = others[len(others) - (keep - len(forced)) :]
        cache = sorted(forced + newest) + recent

    evict_if_due()
    for t in range(prompt_len, total):
        cache.append(t)
        mask[t, cache] = True
        evict_if_due()
    return mask


def answer_logprob(
    tiny: LoadedModel, prompt: list[int], continuation: list[int], answer: list[int], pinned: set[int]
) -> float:
    ids = torch.tensor([prompt + continuation])
    allowed = visible(len(prompt), ids.shape[1], pinned)
    bias = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with torch.inference_mode():
        logits = tiny.model(input_ids=ids, attention_mask=bias[None, None]).logits.float()
    logprobs = logits.log_softmax(dim=-1)[0]
    start = len(prompt)
    return sum(logprobs[start + t - 1, continuation[t]].item() for t in answer)


@pytest.mark.slow
def test_pinned_needle_is_kept_in_every_head_and_scored_as_such(tmp_path: Path, tiny: LoadedModel) -> None:
    stored = {}
    for pins in (0, 1, tiny.facts.num_kv_heads):
        task = tmp_path / f"planted-pin{pins}.yaml"
        task.write_text(TASK.format(name=f"planted-pin{pins}", pins=pins))
        result = kvbench(
            "run",
            *("--model", "tiny-qwen3", "--task", str(task), "--policy", "streaming", "--budget", str(BUDGET)),
            *("--samples", "1", "--limit", "1", "--no-baselines", "--quiet"),
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        con = duckdb.connect(str(tmp_path / "runs" / "kvbench.duckdb"), read_only=True)
        stored[pins] = con.execute(
            "SELECT s.answer_logprob, r.run_id, s.needle_survival_by_head, s.needle_survival "
            "FROM samples s JOIN runs r USING (run_id) WHERE r.task = ?",
            [f"planted-pin{pins}"],
        ).fetchall()
        con.close()
        assert len(stored[pins]) == 1

    request = RunRequest(
        models=("tiny-qwen3",), tasks=(str(task),), policies=("streaming",), budget=BUDGET, samples=1, limit=1
    )
    cell = next(c for c in plan(request) if c.role == "policy")
    (problem,) = cell_problems(cell, HFBackend(tiny))
    prompt, continuation, where = encode_problem(problem, HFBackend(tiny))
    needle = next(p.text for p in problem.pieces if p.role == "needle")
    assert tiny.tokenizer.decode([continuation[t] for t in where["needle"]]) == needle
    needle_positions = {len(prompt) + t for t in where["needle"]}

    free = answer_logprob(tiny, prompt, continuation, where["answer"], pinned=set())
    kept = answer_logprob(tiny, prompt, continuation, where["answer"], pinned=needle_positions)
    assert abs(free - kept) > 1e-2  # the needle's eviction changes the answer: the check can fail
    assert stored[0][0][0] == pytest.approx(free, abs=1e-3)
    assert stored[tiny.facts.num_kv_heads][0][0] == pytest.approx(kept, abs=1e-3)
    assert stored[0][0][1] != stored[tiny.facts.num_kv_heads][0][1]  # pin_heads is part of the identity
    # the needle's survival at the query, per layer and KV head (layer-major): pinned heads hold all of it
    heads, layers = tiny.facts.num_kv_heads, tiny.facts.num_layers
    assert stored[heads][0][2] == [1.0] * (layers * heads) and stored[heads][0][3] == 1.0
    one = [stored[1][0][2][layer * heads : (layer + 1) * heads] for layer in range(layers)]
    assert all(per_head[0] == 1.0 and per_head[1] < 1.0 for per_head in one)
    assert all(value < 1.0 for value in stored[0][0][2])
