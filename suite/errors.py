"""One error hierarchy: every failure a user can cause says what went wrong and what to do."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class KvbenchError(Exception):
    """Base class of every error kvbench raises on purpose."""


class SpecError(KvbenchError):
    """A spec (YAML file, CLI value or parameter) is malformed: names the source, the field and the fix."""


class UnknownNameError(KvbenchError, KeyError):
    """A name (policy, task, model, ...) that is not registered; lists the known ones."""

    def __init__(self, kind: str, name: str, known: Iterable[str]) -> None:
        known = sorted(known)
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"  # policy -> policies
        super().__init__(f"unknown {kind} {name!r}.{hint} Known {plural}: {', '.join(known) or '(none)'}.")
        self.kind, self.name, self.known = kind, name, known

    def __str__(self) -> str:  # KeyError would otherwise print the message in quotes
        return self.args[0]


class CapabilityError(KvbenchError):
    """A policy needs something (recent queries, per-step attention, ...) that the backend cannot give."""


class PrerequisiteError(KvbenchError):
    """Something must be installed or prepared first; the message carries the command."""


class BudgetError(KvbenchError):
    """A budget/buffer/protection combination that cannot be scheduled fairly."""


class PolicyOutputError(KvbenchError):
    """A scorer returned something the engine cannot select from; names the policy, layer and event."""


class ScorerError(KvbenchError):
    """A scorer raised, hung past its time limit, or its process died; names the policy, layer and event."""


class StorageError(KvbenchError):
    """A file kvbench must write or read cannot be: its file system is full or read-only, or a database
    is damaged. Names the file and what to do."""
