"""What a request carries to vLLM's scheduler and workers: its policy, schedule and seed.

It travels in ``SamplingParams.extra_args["kvbench"]`` (plain JSON-like values, so it crosses vLLM's
process boundaries), which lets one engine serve the policy, the null and the full cache, each request
under its own schedule. The scheduler reads the budget and buffer to cap the request's blocks; the worker
rebuilds the policy by name and makes the engine's Evictor for the request.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass
from typing import Any

from kvbench.core.contract import Policy
from kvbench.core.schedule import Schedule

KEY = "kvbench"


@dataclass(frozen=True)
class RequestConfig:
    policy: str
    """A name the registry resolves (built-in or entry point), or ``path/to/file.py:ClassName``."""
    params: dict[str, Any]
    evicts: bool
    budget: int
    buffer: int
    protection: str
    sinks: int
    order: str
    seed: int
    """The sample's seed: every eviction draw for this request derives from it (as in the hf backend)."""
    query_window: int
    tag: str
    """Names the request in the worker's statistics (vLLM's request ids are its own)."""

    @classmethod
    def of(cls, policy: Policy, schedule: Schedule, seed: int, tag: str) -> RequestConfig:
        return cls(
            policy=policy_reference(policy),
            params=dict(policy.params()),
            evicts=policy.evicts,
            budget=schedule.budget,
            buffer=schedule.buffer,
            protection=schedule.protection,
            sinks=schedule.sinks,
            order=schedule.order,
            seed=seed,
            query_window=max(policy.query_window, 1) if "queries" in policy.needs else 0,
            tag=tag,
        )

    def as_extra_args(self) -> dict[str, Any]:
        return {KEY: asdict(self)}

    @classmethod
    def from_sampling(cls, sampling_params: Any) -> RequestConfig | None:
        """The config in a request's sampling parameters; None for a request kvbench did not send."""
        extra = getattr(sampling_params, "extra_args", None) or {}
        found = extra.get(KEY)
        return cls(**found) if found is not None else None

    def schedule(self) -> Schedule:
        return Schedule(
            budget=self.budget,
            buffer=self.buffer,
            protection=self.protection,  # type: ignore[arg-type]
            sinks=self.sinks,
            order=self.order,  # type: ignore[arg-type]
        )

    def make_policy(self) -> Policy:
        from kvbench.registry import make_policy

        return make_policy(self.policy, **self.params)


def policy_reference(policy: Policy) -> str:
    """How another process finds this policy's class: its registered name, else its file and class."""
    from kvbench.errors import UnknownNameError
    from kvbench.registry import find_policy

    try:
        if find_policy(policy.name).cls is type(policy):
            return policy.name
    except UnknownNameError:
        pass
    source = inspect.getsourcefile(type(policy))
    if source is None:
        raise ValueError(f"policy {policy.name!r}: its class has no source file another process can load")
    return f"{source}:{type(policy).__name__}"
