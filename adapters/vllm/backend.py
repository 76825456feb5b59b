"""The ``vllm`` adapter: kvbench's policies evicting inside a pinned vLLM engine (adapters/base.py).

One engine per loaded model, started with kvbench's scheduler and worker classes (``scheduler_cls``,
``worker_cls``) and the plugin's capturing attention backend. Every request carries its own policy,
schedule and seed (request_config.py), so the policy, the null and the full cache run on one engine.
Tokenization stays kvbench's (the model spec's tokenizer and chat template); vLLM sees token ids only.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvbench.adapters.base import (
    Capabilities,
    Generation,
    Sample,
    Sampling,
    TeacherForced,
    before_stop,
)
from kvbench.adapters.hf.models import LoadedModel, LoadedTokens
from kvbench.adapters.vllm.guard import VLLM_VERSION, check_version
from kvbench.adapters.vllm.paged_schedule import PagedSchedule
from kvbench.adapters.vllm.plugin import ACTIVE
from kvbench.adapters.vllm.request_config import RequestConfig
from kvbench.core.contract import ModelFacts, Policy
from kvbench.core.retention import Retention
from kvbench.core.schedule import Schedule
from kvbench.errors import CapabilityError

BLOCK_SIZE = 32
"""Tokens per KV block: the CPU attention kernel takes multiples of 32; the same value on a GPU keeps the
two comparable."""


KV_POOL_BYTES = 1 << 28
"""The engine's KV pool (256 MiB), sized explicitly: runs do not depend on the machine's free memory."""


class VLLMBackend(LoadedTokens):
    def __init__(self, loaded: LoadedModel, llm: Any, checkpoint: Path, engine_pids: set[int]) -> None:
        self.loaded = loaded
        self.llm = llm
        self.engine_pids = engine_pids
        self.checkpoint = checkpoint
        self.facts: ModelFacts = loaded.facts
        self.preemptions_seen = 0

    def teacher_force(self, *args: Any, **kwargs: Any) -> TeacherForced:
        raise CapabilityError(
            "the vllm adapter decodes only; teacher-forced probes (passkey, planted-fact, fidelity) run "
            "on the hf adapter"
        )

    def calibrate(self) -> Any:
        raise CapabilityError("calibration statistics are computed with the hf adapter")

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
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        _refuse_unsupported(policy, schedule)
        protected = schedule.protected_prefix(len(prompt_ids))
        if refuse_capped_prompt and policy.evicts:
            schedule.refuse_capped(len(prompt_ids))
        tags = [uuid.uuid4().hex for _ in sample_seeds]
        params = [
            SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                seed=seed % (2**63),
                max_tokens=max_new_tokens,
                stop_token_ids=[] if ignore_stop else self.loaded.stop_ids(),
                ignore_eos=ignore_stop,
                # stop strings are matched on detokenized text; vLLM cuts the text before them
                stop=[] if ignore_stop else [s for s in stop_strings if s],
                detokenize=bool(stop_strings) and not ignore_stop,
                extra_args=RequestConfig.of(policy, schedule, seed, tag).as_extra_args(),
            )
            for seed, tag in zip(sample_seeds, tags, strict=True)
        ]
        prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
        started = time.perf_counter()
        outputs = self.llm.generate([prompt] * len(params), params, use_tqdm=False)
        seconds = time.perf_counter() - started
        stats = self.llm.collective_rpc("kvbench_stats", args=(tags,))[0]
        self._refuse_preemption()
        samples = []
        for output, tag in zip(outputs, tags, strict=True):
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            reason = "stop" if completion.finish_reason == "stop" else "length"
            found = stats.get(tag, {})
            kept = found.get("retention")
            text = before_stop(self.loaded.tokenizer.decode(tokens, skip_special_tokens=True), stop_strings)
            retention = Retention(**kept) if kept is not None else None
            samples.append(Sample(tokens, text, reason, int(found.get("events", 0)), retention))  # type: ignore[arg-type]
        select = sum(s.get("seconds_select", 0.0) for s in stats.values())
        move = sum(s.get("seconds_move", 0.0) for s in stats.values())
        return Generation(
            samples=samples,
            prompt_tokens=len(prompt_ids),
            eviction_events=max((s.evictions for s in samples), default=0),
            eviction_seconds=select + move,
            decode_seconds=seconds,
            peak_kv_bytes=sum(
                self._reserved_bytes(policy, schedule, len(prompt_ids), s.generated) for s in samples
            ),
            protected=protected,
            settings={
                "sampling": sampling,
                "max_new_tokens": max_new_tokens,
                "vllm": VLLM_VERSION,
                "eviction_stats": {"select": select, "move": move},
            },
        )

    def engine_stats(self, reset: bool = False) -> dict[str, int]:
        """Forwards run, the most requests in one forward, the most KV blocks held at once (since the
        engine started, or the last reset)."""
        return dict(self.llm.collective_rpc("kvbench_engine_stats", args=(reset,))[0])

    def close(self) -> None:
        """End the engine: vLLM's own shutdown, then any of its processes still alive, by id."""
        import psutil

        try:
            self.llm.llm_engine.engine_core.shutdown()
        finally:
            alive = []
            for pid in self.engine_pids:
                try:
                    process = psutil.Process(pid)
                    process.terminate()
                    alive.append(process)
                except psutil.NoSuchProcess:
                    continue
            _, stubborn = psutil.wait_procs(alive, timeout=10)
            for process in stubborn:
                process.kill()
            self.engine_pids = set()

    def _reserved_bytes(self, policy: Policy, schedule: Schedule, prompt_len: int, generated: int) -> int:
        """The bytes of the KV blocks the request held at its peak (what vLLM really reserved)."""
        paged = PagedSchedule.of(schedule, prompt_len, evicts=policy.evicts)
        facts, dtype_bytes = self.facts, self.loaded.model.dtype.itemsize
        per_slot = 2 * facts.num_layers * facts.num_kv_heads * facts.head_dim * dtype_bytes
        return paged.blocks(prompt_len + generated, BLOCK_SIZE) * BLOCK_SIZE * per_slot

    def preemptions(self) -> int:
        """Preemptions the engine counted since it started (vLLM's own metric)."""
        metrics = self.llm.get_metrics()
        return sum(int(getattr(m, "value", 0)) for m in metrics if m.name == "vllm:num_preemptions")

    def _refuse_preemption(self) -> None:
        count = self.preemptions()
        if count > self.preemptions_seen:
            self.preemptions_seen = count
            raise RuntimeError(
                f"vLLM preempted a request ({count} preemptions so far): a preempted request is recomputed "
                "from its whole logical sequence, which brings evicted tokens back, so these samples are "
                "not under the policy. kvbench's admission should make this impossible: report it."
            )


def _refuse_unsupported(policy: Policy, schedule: Schedule) -> None:
    """CapabilityError, naming the hf adapter, for what vLLM's kernels and paged blocks cannot serve."""
    if "step_attention" in policy.needs:
        raise CapabilityError(
            f"policy {policy.name!r} reads every step's attention weights, which vLLM's attention "
            "kernels never materialise: run it on the hf adapter"
        )
    if "calibration" in policy.needs:
        raise CapabilityError(
            f"policy {policy.name!r} needs calibration statistics: run it on the hf adapter"
        )
    if schedule.precision is not None:
        raise CapabilityError(
            "a mixed-precision cache runs on the hf adapter only: vLLM's paged blocks hold one precision"
        )


class VLLMAdapter:
    name = "vllm"

    def capabilities(self) -> Capabilities:
        return Capabilities(
            needs=frozenset({"queries", "rope"}),
            devices=("cpu",),
            dtypes=("float32", "bfloat16"),
            attentions=("sdpa",),
            teacher_forcing=False,
        )

    def identity(self) -> dict[str, str]:
        return {"vllm": VLLM_VERSION, "block_size": str(BLOCK_SIZE)}

    def load(self, spec: Any, *, device: str, attention: str, progress: bool = True) -> VLLMBackend:
        check_version()
        from kvbench.adapters.vllm.checkpoint import materialize

        loaded, checkpoint = materialize(spec)
        llm, pids = start_engine(checkpoint, spec.dtype)
        return VLLMBackend(loaded, llm, checkpoint, pids)


def start_engine(checkpoint: Path, dtype: str, **overrides: Any) -> tuple[Any, set[int]]:
    """A vLLM engine over ``checkpoint`` with kvbench's scheduler, worker and attention capture, and the
    ids of the processes it started."""
    import psutil

    os.environ[ACTIVE] = "1"  # the plugin acts in this process and the engine's children
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    from vllm import LLM

    settings: dict[str, Any] = {
        "model": str(checkpoint),
        "skip_tokenizer_init": True,
        "dtype": dtype,
        "block_size": BLOCK_SIZE,
        "enable_prefix_caching": False,
        "enforce_eager": True,
        "async_scheduling": False,
        "disable_log_stats": False,
        "seed": 0,
        # a fixed KV pool, not a share of the machine's memory: the same pool on every machine
        "kv_cache_memory_bytes": KV_POOL_BYTES,
        "gpu_memory_utilization": 0.3,
        "scheduler_cls": "kvbench.adapters.vllm.scheduler.KVBenchScheduler",
        "worker_cls": "kvbench.adapters.vllm.worker.EvictingCPUWorker",
    }
    settings.update(overrides)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    llm = LLM(**settings)
    # vLLM names its engine processes VLLM::EngineCore and VLLM::Worker; the multiprocessing resource
    # tracker it also starts belongs to this process and is left alone
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    return llm, {p.pid for p in started if _is_engine(p)}


def _is_engine(process: Any) -> bool:
    import psutil

    try:
        return any(part.startswith("VLLM::") for part in process.cmdline()[:1])
    except psutil.Error:
        return False
