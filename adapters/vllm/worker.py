"""vLLM's CPU worker with kvbench's evicting model runner (selected by ``worker_cls``).

It builds vLLM's V1 model runner and then turns it into an evicting one (runner.py); the adapter declares
the CPU only (docs/vllm.md: the GPU path is not done). ``kvbench_stats`` is reached through
``collective_rpc``.
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


def __getattr__(name: str) -> type:
    # vLLM imports worker_cls by dotted name; the class is built on that first use, so that importing this
    # module needs no vLLM.
    if name != "EvictingCPUWorker":
        raise AttributeError(name)
    from vllm.v1.worker.cpu_worker import CPUWorker

    return type("EvictingCPUWorker", (EvictingWorkerMixin, CPUWorker), {})
