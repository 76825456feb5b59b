"""kvbench inside vLLM's V1 model runner: physical slots before the forward, eviction after it.

Before the forward (``_prepare_inputs``): each row's tokens are written at its stored length, not its
logical one, and attention reads ``stored + new`` slots; RoPE positions stay logical, so keys are rotated
at their true positions. After the forward (``execute_model``): every request whose new length is due
evicts (request_eviction.py), with the queries the capturing attention backend recorded this step.

The runner is vLLM's own (CPU or GPU, V1) with this mixin in front; ``_prepare_inputs`` and
``execute_model`` are the two private methods it overrides (signatures checked in guard.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from kvbench.adapters.vllm.paged_kv import CONTENT_OF_BACKEND, key_value_views
from kvbench.adapters.vllm.paged_schedule import PagedSchedule
from kvbench.adapters.vllm.request_config import RequestConfig
from kvbench.adapters.vllm.request_eviction import RequestEviction
from kvbench.core.contract import ModelFacts
from kvbench.core.engine import Evictor
from kvbench.core.rope import rope_inv_freq
from kvbench.errors import CapabilityError

CHECKS = "KVBENCH_VLLM_CHECKS"


@dataclass
class QueryCapture:
    """The last W post-RoPE queries of every layer for the requests whose policy reads them."""

    num_layers: int
    plan: list[tuple[str, int, int, int]] = field(default_factory=list)
    """This step's (request tag, first token, end token, window) rows to record."""
    recent: dict[str, list[Tensor | None]] = field(default_factory=dict)

    def record(self, layer: int, query: Tensor) -> None:
        """Called by the attention backend with the layer's queries [tokens, Hq, D]."""
        for tag, start, end, window in self.plan:
            new = query[start:end].permute(1, 0, 2).unsqueeze(0).float()  # [1, Hq, n, D]
            held = self.recent.setdefault(tag, [None] * self.num_layers)
            previous = held[layer]
            both = new if previous is None else torch.cat([previous, new], dim=2)
            held[layer] = both[:, :, -window:].clone()


@dataclass
class StepRow:
    tag: str
    req_id: str
    length: int
    """Logical length after this step's tokens."""


class Evictions:
    """The worker's eviction state: one RequestEviction per running kvbench request, and their stats."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.requests: dict[str, RequestEviction] = {}
        self.tags: dict[str, str] = {}
        self.finished: dict[str, dict[str, float]] = {}
        self.step: list[StepRow] = []
        self.facts: ModelFacts | None = None
        self.capture: QueryCapture | None = None
        self.layer_names: list[str] = []
        self.plain_rope = True
        self.engine = {"steps": 0, "peak_running": 0, "peak_blocks": 0, "checked_rows": 0}
        """Engine-wide counters: forwards, the most requests in one forward, the most KV blocks held."""
        self.checking = os.environ.get(CHECKS) == "1"

    # -- set-up ------------------------------------------------------------------------------------
    def bind(self) -> None:
        """Find the attention layers (in model order) and give each the query capture."""
        from vllm.model_executor.models.utils import extract_layer_index

        context = self.runner.compilation_config.static_forward_context
        groups = self.runner.kv_cache_config.kv_cache_groups
        if len(groups) != 1:
            raise CapabilityError(
                f"kvbench evicts in models with one KV-cache group; this one has {len(groups)}"
            )
        self.layer_names = sorted(groups[0].layer_names, key=extract_layer_index)
        config = self.runner.model_config.hf_text_config
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        rope: dict[str, Any] = getattr(config, "rope_parameters", None) or {}
        theta: float = rope.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
        self.plain_rope = rope.get("rope_type", "default") == "default"
        self.facts = ModelFacts(
            name=str(self.runner.model_config.model),
            num_layers=len(self.layer_names),
            num_q_heads=heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            rope_inv_freq=rope_inv_freq(head_dim, float(theta)).float(),
        )
        self.capture = QueryCapture(len(self.layer_names))
        for index, name in enumerate(self.layer_names):
            layer = context[name]
            layer.kvbench_capture = self.capture
            layer.kvbench_layer = index
        backend = context[self.layer_names[0]].attn_backend.get_name()
        if backend not in CONTENT_OF_BACKEND:
            raise CapabilityError(
                f"kvbench's vLLM compaction knows the {', '.join(CONTENT_OF_BACKEND)} KV layouts; "
                f"this engine runs {backend}"
            )
        self.content = CONTENT_OF_BACKEND[backend]
        if backend == "CPU_ATTN":
            from kvbench.adapters.vllm.attention import verify_cpu_layout

            first = context[self.layer_names[0]]
            verify_cpu_layout(first.isa, first.kv_cache.dtype, self.runner.cache_config.block_size, head_dim)

    def views(self) -> list[tuple[Tensor, Tensor]]:
        context = self.runner.compilation_config.static_forward_context
        return [key_value_views(context[name].kv_cache, self.content) for name in self.layer_names]

    def request(self, req_id: str) -> RequestEviction | None:
        if req_id in self.requests:
            return self.requests[req_id]
        state = self.runner.requests[req_id]
        config = RequestConfig.from_sampling(state.sampling_params)
        if config is None:
            return None
        if self.facts is None:
            self.bind()
        assert self.facts is not None
        policy = config.make_policy()
        if "rope" in policy.needs and not self.plain_rope:
            raise CapabilityError(
                f"policy {policy.name!r} reads RoPE frequencies, and this model's RoPE is scaled: the vllm "
                "adapter derives them from rope_theta alone; run it on the hf adapter"
            )
        prompt_len = len(state.prompt_token_ids)
        evictor = Evictor(
            policy, config.schedule(), self.facts, prompt_len=prompt_len, row_seeds=[config.seed]
        )
        paged = PagedSchedule(config.budget, config.buffer, prompt_len, evicts=policy.evicts)
        self.requests[req_id] = RequestEviction(evictor, paged, self.facts.num_layers)
        self.tags[req_id] = config.tag
        return self.requests[req_id]

    # -- every step --------------------------------------------------------------------------------
    def begin(self, scheduler_output: Any) -> None:
        self.step = []
        for req_id in scheduler_output.finished_req_ids:
            self._finish(req_id)

    def prepare(self, num_scheduled: np.ndarray) -> None:
        """After vLLM prepared the inputs: slots and sequence lengths by stored length; the query plan."""
        runner = self.runner
        batch = runner.input_batch
        rows = batch.num_reqs
        deltas = np.zeros(rows, dtype=np.int64)
        plan = []
        ends = np.cumsum(num_scheduled[:rows])
        for row, req_id in enumerate(batch.req_ids[:rows]):
            request = self.request(req_id)
            if request is None:
                continue
            before = int(batch.num_computed_tokens_cpu[row])
            count = int(num_scheduled[row])
            deltas[row] = before - request.paged.stored(before)
            self.step.append(StepRow(self.tags[req_id], req_id, before + count))
            window = request.evictor.policy.query_window if "queries" in request.evictor.policy.needs else 0
            if window:
                end = int(ends[row])
                plan.append((self.tags[req_id], end - min(window, count), end, max(window, 1)))
        assert self.capture is not None or not plan
        if self.capture is not None:
            self.capture.plan = plan
        held = [len(runner.requests[req_id].block_ids[0]) for req_id in batch.req_ids[:rows]]
        engine = self.engine
        engine["steps"] += 1
        engine["peak_running"] = max(engine["peak_running"], rows)
        engine["peak_blocks"] = max(engine["peak_blocks"], sum(held))
        if deltas.any():
            total = int(ends[-1])
            per_token = torch.from_numpy(np.repeat(deltas, num_scheduled[:rows])).to(runner.positions.device)
            physical = runner.positions[:total] - per_token
            batch.block_table.compute_slot_mapping(rows, runner.query_start_loc.gpu[: rows + 1], physical)
            shift = torch.from_numpy(deltas)
            runner.seq_lens[:rows] -= shift.to(runner.seq_lens.device, runner.seq_lens.dtype)
            runner.optimistic_seq_lens_cpu[:rows] -= shift.to(runner.optimistic_seq_lens_cpu.dtype)
        if self.checking:
            self._check(num_scheduled, ends, deltas)

    def _check(self, num_scheduled: np.ndarray, ends: np.ndarray, deltas: np.ndarray) -> None:
        """Every row's slots, sequence length and blocks, against the stored length computed here
        (``KVBENCH_VLLM_CHECKS=1``: the bookkeeping tests turn it on)."""
        runner = self.runner
        batch = runner.input_batch
        block_size = runner.cache_config.block_size
        slots = batch.block_table[0].slot_mapping.gpu.cpu()
        seq_lens = runner.seq_lens.cpu()
        for row, req_id in enumerate(batch.req_ids[: batch.num_reqs]):
            state = runner.requests[req_id]
            request = self.requests.get(req_id)
            before = int(batch.num_computed_tokens_cpu[row])
            count = int(num_scheduled[row])
            stored = before - int(deltas[row])
            blocks = state.block_ids[0]
            want = [
                blocks[(stored + j) // block_size] * block_size + (stored + j) % block_size
                for j in range(count)
            ]
            got = slots[int(ends[row]) - count : int(ends[row])].tolist()
            problems = []
            if got != want:
                problems.append(f"slots {got[:4]}... where {want[:4]}... was due")
            if int(seq_lens[row]) != stored + count:
                problems.append(f"attention reads {int(seq_lens[row])} slots, not {stored + count}")
            if len(blocks) * block_size < stored + count:
                problems.append(f"{len(blocks)} blocks cannot hold {stored + count} slots")
            if request is not None:
                total = len(state.prompt_token_ids) + state.sampling_params.max_tokens
                cap = request.paged.blocks(total, block_size)
                if len(blocks) > cap:
                    problems.append(f"{len(blocks)} blocks held, over the cap of {cap}")
            if problems:
                raise AssertionError(f"request {req_id} at length {before}: " + "; ".join(problems))
            self.engine["checked_rows"] += 1

    def after_forward(self) -> None:
        """Run the events due at this step's new lengths."""
        due = [row for row in self.step if self.requests[row.req_id].paged.due(row.length)]
        if not due:
            return
        views = self.views()
        block_size = self.runner.cache_config.block_size
        for row in due:
            request = self.requests[row.req_id]
            needs_queries = "queries" in request.evictor.policy.needs
            queries = self.capture.recent.get(row.tag) if needs_queries and self.capture else None
            request.evict(
                views,
                self.runner.requests[row.req_id].block_ids[0],
                length=row.length,
                block_size=block_size,
                queries=queries,
            )

    def _finish(self, req_id: str) -> None:
        request = self.requests.pop(req_id, None)
        tag = self.tags.pop(req_id, None)
        if request is None or tag is None:
            return
        if self.capture is not None:
            self.capture.recent.pop(tag, None)
        self.finished[tag] = request.report()

    def stats(self, tags: list[str]) -> dict[str, dict[str, Any]]:
        """Eviction statistics of the requests tagged ``tags`` (finished ones are then forgotten).

        The last requests of a batch finish without a later step telling the worker, so live ones are
        read too."""
        live = {self.tags[req_id]: request for req_id, request in self.requests.items()}
        found = {}
        for tag in tags:
            if tag in self.finished:
                found[tag] = self.finished.pop(tag)
            elif tag in live:
                found[tag] = live[tag].report()
        return found


class EvictingRunnerMixin:
    """Put in front of vLLM's V1 model runner class (CPU or GPU)."""

    kvbench: Evictions

    def _prepare_inputs(self, scheduler_output: Any, num_scheduled_tokens: np.ndarray) -> Any:
        result = super()._prepare_inputs(scheduler_output, num_scheduled_tokens)  # type: ignore[misc]
        self.kvbench.prepare(num_scheduled_tokens)
        return result

    def execute_model(self, scheduler_output: Any, intermediate_tensors: Any = None) -> Any:
        self.kvbench.begin(scheduler_output)
        output = super().execute_model(scheduler_output, intermediate_tensors)  # type: ignore[misc]
        self.kvbench.after_forward()
        return output


def make_evicting(runner: Any) -> None:
    """Turn a V1 model runner into an evicting one, in place."""
    base = type(runner)
    runner.__class__ = type(f"Evicting{base.__name__}", (EvictingRunnerMixin, base), {})
    runner.kvbench = Evictions(runner)
