"""The ``hf`` adapter: kvbench's cache inside Hugging Face transformers models (adapters/base.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvbench.adapters.base import Capabilities, Generation, ModelShape, TeacherForced
from kvbench.adapters.hf.models import LoadedModel, LoadedTokens
from kvbench.core.contract import NEEDS, ModelFacts, Policy
from kvbench.core.schedule import Schedule


class HFBackend(LoadedTokens):
    """One loaded transformers model; ``loaded`` stays reachable for hf-only tools (benchmarks)."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.facts: ModelFacts = loaded.facts
        from kvbench.adapters.hf.teacher import FullCacheMemo

        self._full_cache_memo = FullCacheMemo()  # the last problem's full-cache predictions

    @property
    def shape(self) -> ModelShape:
        """The loaded model's shape, its parameters counted as loaded (the memory plan's input)."""
        from kvbench.adapters.hf.models import shape_of

        network = self.loaded.model
        return shape_of(self.loaded.spec, network.config, sum(p.numel() for p in network.parameters()))

    # The keyword options are Backend's (adapters/base.py), passed on as they are named there.
    def teacher_force(
        self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], policy: Policy, schedule: Schedule,
        **options: Any,
    ) -> TeacherForced:  # fmt: skip
        from kvbench.adapters.hf.teacher import teacher_force

        memo = self._full_cache_memo
        return teacher_force(
            self.loaded, prompt_ids, continuation_ids, policy, schedule, memo=memo, **options
        )

    def generate(
        self, prompt_ids: Sequence[int], policy: Policy, schedule: Schedule, **options: Any
    ) -> Generation:
        from kvbench.adapters.hf.decode import generate

        return generate(self.loaded, prompt_ids, policy, schedule, **options)

    def calibrate(self) -> Any:
        from kvbench.adapters.hf.calibrate import calibrate

        return calibrate(self.loaded)


class HFAdapter:
    name = "hf"

    def capabilities(self) -> Capabilities:
        from kvbench.adapters.hf.attention import INNER

        return Capabilities(
            needs=frozenset(NEEDS),
            devices=("cpu", "cuda"),
            dtypes=("float32", "bfloat16", "float16"),
            attentions=INNER,
            mixed_precision=True,
        )

    def identity(self) -> dict[str, str]:
        return {}

    def shape(self, spec: Any) -> ModelShape:
        """The spec's model shape from its config alone (kvbench.runner.memory plans with it)."""
        from kvbench.adapters.hf.models import model_shape

        return model_shape(spec)

    def load(self, spec: Any, *, device: str, attention: str, progress: bool = True) -> HFBackend:
        from kvbench.adapters.hf.models import check_transformers, load_model

        check_transformers()
        return HFBackend(load_model(spec, device=device, attention=attention, progress=progress))
