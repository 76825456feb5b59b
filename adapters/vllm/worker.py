"""vLLM's worker with kvbench's evicting model runner (selected by ``worker_cls``).

The CPU and GPU workers differ only in their base class; both build vLLM's V1 model runner and then
turn it into an evicting one (runner.py). ``kvbench_stats`` is reached through ``collective_rpc``.
"""

from __future__ import annotations

from typing import Any

from kvbench.adapters.vllm.runner import make_evicting


class EvictingWorkerMixin:
    model_runner: Any
    use_v2_model_runner: bool

    def init_device(self) -> None:
        super().init_device()  # type: ignore[misc]
        if self.use_v2_model_runner:
            raise RuntimeError(
                "kvbench evicts inside vLLM's V1 model runner; this worker built the V2 one: "
                "set VLLM_USE_V2_MODEL_RUNNER=0 (kvbench's vllm adapter does)"
            )
        make_evicting(self.model_runner)

    def kvbench_stats(self, tags: list[str]) -> dict[str, dict[str, Any]]:
        return self.model_runner.kvbench.stats(tags)

    def kvbench_engine_stats(self, reset: bool = False) -> dict[str, int]:
        engine = self.model_runner.kvbench.engine
        found = dict(engine)
        if reset:
            engine.update(dict.fromkeys(engine, 0))
        return found


def _cpu_worker() -> type:
    from vllm.v1.worker.cpu_worker import CPUWorker

    return type("EvictingCPUWorker", (EvictingWorkerMixin, CPUWorker), {})


def _gpu_worker() -> type:
    from vllm.v1.worker.gpu_worker import Worker

    return type("EvictingGPUWorker", (EvictingWorkerMixin, Worker), {})


def __getattr__(name: str) -> type:
    # vLLM imports worker_cls by dotted name; building the classes lazily keeps this module importable
    # where only one of the two bases can load.
    if name == "EvictingCPUWorker":
        return _cpu_worker()
    if name == "EvictingGPUWorker":
        return _gpu_worker()
    raise AttributeError(name)
