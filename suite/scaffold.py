"""``kvbench new-policy NAME``: a commented, working scorer template for the user to edit."""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from kvbench.core.contract import policy_name_problem
from kvbench.errors import SpecError

TEMPLATE = '''"""{title}: one line saying what this scorer keeps.

Source: name the paper or repository this scorer follows, so that anyone can check it.
Recorded choices: say here what you decided where the source is ambiguous (window, pooling, ...).
"""

from __future__ import annotations

from torch import Tensor

from kvbench.core.contract import EvictionView, WindowedPolicy, policy
from kvbench.policies.scoring import value_range, window_attention


# `needs` declares what the backend must provide: "queries" gives view.queries [B, Hq, W, D], the last
# W post-RoPE queries. Drop it, and subclass Policy instead, if your scorer does not read queries.
@policy("{name}", needs={{"queries"}})
class {cls}(WindowedPolicy):
    """{title}: attention of the recent queries, weighted by value range (edit me)."""

    # Fields are the scorer's parameters, recorded with every result; give each a default. Set them with
    #     --policy {selector}:window=32
    # WindowedPolicy gives the engine `window` as the number of recent queries to record.
    window: int = 64

    def score(self, view: EvictionView) -> Tensor:
        # Return [B, Hkv, n] float32 scores for the n candidates (every cached slot but the buffer);
        # higher = keep. The engine keeps the top K − B per KV head, always keeps protected slots
        # (prompt or sinks, by protocol) and the buffer, and compacts the cache: never select here.
        # Draw randomness only from view.uniform / view.normal / view.gumbel (seeded per row, layer, event).
        attention = window_attention(self.recent_queries(view), view.keys)
        return attention * value_range(view.values)
'''


def class_name(name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[-_]", name) if part)


def selector(name: str, path: Path, builtin: bool) -> str:
    """The ``--policy`` text that selects the scorer ``name`` written at ``path``: its name when it is a
    built-in (written into kvbench's policies/), otherwise the file and its class."""
    if builtin:
        return name
    # a relative path keeps its "./": `--policy my_scorer.py:X` would read as a policy name with parameters
    shown = path if path.is_absolute() else f"./{path}" if path.parent == Path() else path
    return f"{shown}:{class_name(name)}"


def write_template(name: str, folder: Path, *, builtin: bool = False) -> tuple[Path, str]:
    """Write ``folder/<module>.py`` for policy ``name``; refuse to overwrite an existing file. Returns the
    file and the ``--policy`` text that selects it (``builtin``: the folder is kvbench's policies/), which
    the template's comment shows with a parameter."""
    problem = policy_name_problem(name)
    if problem:
        raise SpecError(f"kvbench new-policy: {problem}")
    module = name.replace("-", "_")
    if keyword.iskeyword(module):
        raise SpecError(f"policy name {name!r} is a Python keyword; choose another")
    path = folder / f"{module}.py"
    if path.exists():
        raise SpecError(
            f"{path} exists already; kvbench new-policy never overwrites a file. Choose another name."
        )
    use = selector(name, path, builtin)
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(TEMPLATE.format(name=name, cls=class_name(name), title=class_name(name), selector=use))
    return path, use
