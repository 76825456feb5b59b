"""The kvpress presses in ``kvbench list policies``: each one found, supported or not and why."""

from __future__ import annotations

from kvbench.errors import SpecError
from kvbench.kvpress.catalog import fed, reason
from kvbench.kvpress.environment import installed_presses, interpreter


def kvpress_lines() -> list[tuple[str, str]]:
    """``(kvpress:Name, what it is)`` for each ScorerPress of the kvpress venv, or one line saying how to
    get that venv."""
    python = interpreter()
    if python is None or not python.is_file():
        hint = "no kvpress venv here; `make kvpress-venv` builds one (docs/kvpress.md)"
        return [("kvpress:*", f"kvpress presses: {hint}")]
    try:
        version, found = installed_presses()
    except SpecError as exc:
        return [("kvpress:*", f"kvpress presses could not be listed: {exc}")]
    lines = []
    for name in found:
        why = reason(name)
        status = f"supported (fed: {fed(name)})" if why is None else f"not supported: {why}"
        lines.append((f"kvpress:{name}", f"kvpress {version} press, {status}"))
    return lines
