"""kvpress presses as a bundle's entrants: an installed package's code, not a submitter's, so a bundle
ships no source for them; the run's identity records the press, its parameters and the kvpress version,
and `kvbench verify` rebuilds the press in this machine's kvpress environment (kvbench.kvpress), which
must hold that version."""

from __future__ import annotations

from typing import Any

from kvbench.core.contract import Policy
from kvbench.kvpress.catalog import press_of
from kvbench.registry import builtin_policies
from kvbench.store.manifest import PolicyDoc


def is_press(name: str, doc: PolicyDoc | None) -> bool:
    """Whether a run's policy is a kvpress press: its name is one (``kvpress-knorm``) and its recorded
    documentation says so."""
    return press_of(name) is not None and doc is not None and doc.origin == "kvpress"


def shipped_scorer(name: str, doc: PolicyDoc | None) -> bool:
    """Whether a run's policy is a scorer its bundle ships (code that runs behind the sandbox), not one of
    kvbench's policies nor a kvpress press."""
    return name not in builtin_policies() and not is_press(name, doc)


def press_policy(name: str, params: dict[str, Any]) -> Policy:
    """The press a recorded name and parameters (the kvpress version among them) describe."""
    from kvbench.kvpress.policy import KvpressPolicy

    press = press_of(name)
    assert press is not None
    return KvpressPolicy(press, params)
