"""The probe metrics a leaderboard publishes, against computations made here without kvbench's cache:
where fidelity scoring starts, how agreement and KL are averaged, and which tokens passkey scores."""

from __future__ import annotations

import pytest
import torch

from kvbench.adapters.hf.backend import HFBackend
from kvbench.adapters.hf.models import LoadedModel
from kvbench.adapters.hf.teacher import teacher_force
from kvbench.graders.registry import Graders
from kvbench.runner.execute import cell_problems
from kvbench.runner.plan import RunRequest, plan
from kvbench.runner.probe_units import ProbeTaskSource, encode_problem

SEEDS = [5, 6]


def the_cell(task: str, policy: str):
    cells = plan(RunRequest(models=("tiny-qwen3",), tasks=(task,), policies=(policy,), limit=1, samples=2))
    return next(c for c in cells if c.role == "policy")


def test_fidelity_scores_from_the_first_prediction_the_first_eviction_can_change(tiny: LoadedModel) -> None:

    cell = the_cell("fidelity", "random")
    (problem,) = cell_problems(cell, HFBackend(tiny))
    prompt, continuation, _ = encode_problem(problem, HFBackend(tiny))
    forced = teacher_force(
        tiny, prompt, continuation, cell.policy, cell.schedule(), row_seeds=SEEDS, reference=True
    )
    kl = forced.kl_to_full
    # found from the data, not from the schedule's formula: before the first eviction every prediction
    # equals the full cache's exactly; the first one after it does not
    changed = (kl.abs() > 0).any(dim=0).nonzero()[0].item()
    assert torch.all(kl[:, :changed] == 0) and changed > 0
    rows = ProbeTaskSource().score(cell, HFBackend(tiny), problem, SEEDS, None, Graders())
    for i, row in enumerate(rows):
        secondary = row.secondary
        agree = forced.top1_agrees_with_full[i, changed:].float()
        assert secondary["scored_tokens"] == agree.numel()
        assert row.metric == pytest.approx(agree.mean().item(), abs=1e-12)
        assert row.kl_to_full == pytest.approx(kl[i, changed:].mean().item(), rel=1e-9)


def test_passkey_scores_exactly_the_passcode_tokens(tiny: LoadedModel) -> None:

    cell = the_cell("passkey", "full")
    (problem,) = cell_problems(cell, HFBackend(tiny))
    prompt, continuation, where = encode_problem(problem, HFBackend(tiny))
    answer = next(p.text for p in problem.pieces if p.role == "answer")
    assert tiny.tokenizer.decode([continuation[t] for t in where["answer"]]) == answer
    assert where["answer"] == list(range(len(continuation) - len(where["answer"]), len(continuation)))
    # the answer's log-probability from one plain forward of the whole sequence (no kvbench cache)
    ids = torch.tensor([prompt + continuation])
    with torch.inference_mode():
        logprobs = tiny.model(input_ids=ids).logits.float().log_softmax(dim=-1)[0]
    start = len(prompt)
    expected = sum(logprobs[start + t - 1, continuation[t]].item() for t in where["answer"])
    greedy = all(logprobs[start + t - 1].argmax().item() == continuation[t] for t in where["answer"])
    rows = ProbeTaskSource().score(cell, HFBackend(tiny), problem, SEEDS, None, Graders())
    for row in rows:
        assert row.answer_logprob == pytest.approx(expected, abs=1e-3)
        assert row.secondary["answer_tokens"] == len(where["answer"])
        assert row.correct is greedy and row.metric == float(greedy)
