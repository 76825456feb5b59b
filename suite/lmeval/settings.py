"""The model args of lm-eval's ``kvbench`` model, validated, and the schedule they resolve to."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import pydantic

from kvbench.core.contract import Policy
from kvbench.core.schedule import Schedule
from kvbench.errors import SpecError
from kvbench.specs.loading import with_overrides
from kvbench.specs.model import ModelSpec, load_model_spec
from kvbench.specs.protocol import BudgetRule, ProtocolSpec, load_protocol

ARG_FLAGS = {"buffer": "buffer=", "seed": "seed=", "dtype": "dtype="}


class EvictionSettings(pydantic.BaseModel):
    """``--model_args`` of ``--model kvbench``. The budget is ``budget=K``, or ``ratio=R`` with
    ``n_avg=N`` (K = N/R rounded as the protocol rounds it). Without either, the protocol's own rule
    applies: a fixed K, or its ratio, which also needs ``n_avg=``."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    model: str
    """A kvbench model name (``kvbench list models``) or a model YAML."""
    policy: str
    """As ``kvbench run --policy``: a name, with parameters after a colon (``rkv:lam=0.1``)."""
    protocol: str = "protect-prompt"
    budget: int | None = pydantic.Field(default=None, gt=0)
    ratio: float | None = pydantic.Field(default=None, gt=1.0)
    n_avg: float | None = pydantic.Field(default=None, gt=0)
    """The mean generated length K = n_avg/ratio follows (e.g. a full-cache run's)."""
    buffer: int | None = pydantic.Field(default=None, ge=1)
    """Overrides the protocol's buffer B (recorded)."""
    seed: int | None = pydantic.Field(default=None, ge=0)
    """Overrides the protocol's seed (recorded)."""
    adapter: str = "hf"
    device: str = "cpu"
    dtype: str | None = None
    attention: str = "sdpa"

    @classmethod
    def from_model_args(cls, args: dict[str, Any]) -> EvictionSettings:
        try:
            return cls.model_validate(args)
        except pydantic.ValidationError as exc:
            problems = []
            for err in exc.errors():
                name = ".".join(str(p) for p in err["loc"])
                if err["type"] == "extra_forbidden":
                    known = ", ".join(cls.model_fields)
                    problems.append(f"{name}= is not a model arg of kvbench (known: {known})")
                elif err["type"] == "missing":
                    problems.append(f"{name}= is required")
                else:
                    problems.append(f"{name}={err.get('input')!r}: {err['msg']}")
            raise SpecError("model kvbench: " + "; ".join(problems)) from None

    @cached_property
    def model_spec(self) -> ModelSpec:
        spec = load_model_spec(self.model)
        return spec if self.dtype is None else with_overrides(spec, {"dtype": self.dtype}, ARG_FLAGS)

    @cached_property
    def policy_instance(self) -> Policy:
        from kvbench.registry import make_policy

        return make_policy(self.policy)

    @cached_property
    def protocol_spec(self) -> ProtocolSpec:
        protocol = load_protocol(self.protocol)
        updates = {k: v for k, v in (("buffer", self.buffer), ("seed", self.seed)) if v is not None}
        return with_overrides(protocol, updates, ARG_FLAGS)

    def budget_and_rule(self) -> tuple[int | None, bool]:
        """(K, whether a ratio set it); K is None for a policy that never evicts and was given none."""
        protocol = self.protocol_spec
        if self.budget is not None and self.ratio is not None:
            raise SpecError("model kvbench: give budget= (a fixed K) or ratio= (K = n_avg/ratio), not both")
        if self.budget is not None:
            return self.budget, False
        rule = protocol.budget if self.ratio is None else BudgetRule(ratio=self.ratio)
        if rule.fixed is not None:
            return rule.fixed, False
        if self.n_avg is None:
            if not self.policy_instance.evicts:
                return None, False
            raise SpecError(
                f"model kvbench: K = N_avg/{rule.ratio:g} needs n_avg= (the mean generated length, e.g. of "
                "a full-cache run of this task); or give budget=K"
            )
        return rule.budget(self.n_avg, protocol.buffer), True

    def schedule(self) -> Schedule:
        budget, from_ratio = self.budget_and_rule()
        protocol = self.protocol_spec
        if budget is None:  # the full cache never evicts: any valid K describes its schedule
            budget = protocol.buffer + 1
        try:
            return protocol.schedule(budget, from_ratio=from_ratio)
        except Exception as exc:
            raise SpecError(
                f"model kvbench: {exc}; pass a larger budget=, or buffer= to override the protocol's "
                f"B={protocol.buffer}"
            ) from None

    def record(self, schedule: Schedule) -> dict[str, Any]:
        """What lm-eval's results record of the eviction: every setting a comparison must hold fixed."""
        import kvbench
        from kvbench.registry import policy_record

        budget, from_ratio = self.budget_and_rule()
        return {
            "kvbench_version": kvbench.__version__,
            "model": self.model_spec.model_dump(mode="json"),
            "policy": policy_record(self.policy_instance),
            "protocol": self.protocol_spec.identity(),
            "budget": budget,
            "budget_from_ratio": from_ratio,
            "n_avg": self.n_avg,
            "buffer": schedule.buffer,
            "protection": schedule.protection,
            "adapter": self.adapter,
            "device": self.device,
            "attention": self.attention,
        }
