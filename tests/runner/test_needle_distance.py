"""The needle-distance probe: problems at different depths, each sample storing how many eviction events
its fact lived through before the question, counted here from the schedule's rule alone; and the
retention telemetry stored with every probe sample."""

from __future__ import annotations

from kvbench.adapters.hf.backend import HFBackend
from kvbench.adapters.hf.models import LoadedModel
from kvbench.graders.registry import Graders
from kvbench.runner.execute import cell_problems
from kvbench.runner.plan import RunRequest, plan
from kvbench.runner.probe_units import ProbeTaskSource, encode_problem


def test_each_depth_stores_the_events_between_its_fact_and_its_question(tiny: LoadedModel) -> None:
    request = RunRequest(models=("tiny-qwen3",), tasks=("needle-distance",), policies=("random",), limit=4)
    cell = next(c for c in plan(request) if c.role == "policy")
    backend = HFBackend(tiny)
    budget, buffer = cell.schedule().budget, cell.schedule().buffer
    found = []
    for problem in cell_problems(cell, backend):
        prompt, _, where = encode_problem(problem, backend)
        needle_end = len(prompt) + max(where["needle"])
        question = len(prompt) + where["query"][0]
        # events fire once the cache holds K + B, 2B more, ...: tokens seen K + jB while nothing was left
        # out of the cache before the first event (the prompt is shorter than K + B here)
        assert len(prompt) < budget + buffer
        expected = sum(
            1
            for j in range(1, 1000)
            if needle_end < budget + (j - 1) * buffer and budget + j * buffer <= question
        )
        (row,) = ProbeTaskSource().score(cell, backend, problem, [7], None, Graders())
        assert row.needle_events == expected, problem.depth
        assert row.secondary["depth"] == problem.depth
        layers = tiny.facts.num_layers
        assert row.head_coverage is not None and len(row.head_coverage) == layers
        assert row.prompt_held_all == [1.0] * layers  # the protocol protects the prompt
        assert row.kept_by_age is not None and len(row.kept_by_age) == 10
        found.append((problem.depth, expected))
    assert [d for d, _ in found] == [128, 384, 640, 896]
    events = [e for _, e in found]
    assert events == sorted(events) and events[0] < events[-1]  # farther facts live through more events
