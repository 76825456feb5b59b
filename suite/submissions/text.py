"""What counts as well-formed text in a bundle, field by field: the ``text`` rule of `kvbench accept`
(kvbench.submissions.rules) refuses the rest, naming the field and what is wrong with it.

A submitter controls every string a bundle carries. Each is UTF-8 text with no lone surrogate (JSON can
spell one, ``"\\ud800"``, and it then fails wherever the text is written out again: a terminal, DuckDB, a
CSV download). A one-line field (a name, a label, a parameter, a problem id, the submitter) holds no
control character at all; a field of lines (the description, a policy's documentation, the rest of a
spec) may hold newlines and tabs; a model's output and a grader's detail may hold any character the model
wrote, and are printed through kvbench.commands.common.printable. Every field has a length bound of its
class, below.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kvbench.printable import FORMAT_CHARACTERS

NAME_CHARS = 128
"""A model, task, policy, protocol or suite name, a parameter's name, a policy's class, a sample's task:
what labels and member names are built from (a member name's part is at most 128 characters)."""
LABEL_CHARS = 512
"""A run's label: ``model/task/policy@K=budget``, three names and a budget."""
PARAMETER_CHARS = 1024
"""A policy parameter's string value (and each string inside a list or mapping parameter)."""
PROBLEM_ID_CHARS = 256
"""A problem id: a dataset's own id or an index, never the problem's text."""
SUBMITTER_CHARS = 256
"""Who submits: a name, a group, a contact."""
DESCRIPTION_CHARS = 8192
"""What the submission is: a few paragraphs."""
SHORT_CHARS = 1024
"""A sample's finish reason and grader version, and a bundle manifest's other strings (run ids, digests,
member names, versions)."""
SPEC_TEXT_CHARS = 262_144
"""Any other string of a run's manifest: a task's prompt template, a policy's documentation, the suite's
YAML, the provenance (versions, hardware)."""
OUTPUT_CHARS = 1_000_000
"""A model's output, or a grader's reason and detail on it: a long reasoning trace is some 100,000
characters."""


@dataclass(frozen=True)
class TextField:
    """A class of string field: what a refusal calls it, its bound (named by its constant) and which
    control characters it may hold."""

    kind: str
    limit: int
    bound: str
    lines: bool = False
    """Newlines and tabs are text here."""
    any_character: bool = False
    """Every character but a lone surrogate is text here: what a model writes (printed escaped)."""


NAME = TextField("a name", NAME_CHARS, "NAME_CHARS")
LABEL = TextField("a label", LABEL_CHARS, "LABEL_CHARS")
PARAMETER = TextField("a parameter", PARAMETER_CHARS, "PARAMETER_CHARS")
PROBLEM_ID = TextField("a problem id", PROBLEM_ID_CHARS, "PROBLEM_ID_CHARS")
SUBMITTER = TextField("the submitter", SUBMITTER_CHARS, "SUBMITTER_CHARS")
DESCRIPTION = TextField("the description", DESCRIPTION_CHARS, "DESCRIPTION_CHARS", lines=True)
SHORT = TextField("a short field", SHORT_CHARS, "SHORT_CHARS")
SPEC_TEXT = TextField("a manifest's text", SPEC_TEXT_CHARS, "SPEC_TEXT_CHARS", lines=True)
OUTPUT = TextField("an output", OUTPUT_CHARS, "OUTPUT_CHARS", lines=True, any_character=True)

_SURROGATE = re.compile("[\ud800-\udfff]")
_INVISIBLE = re.escape(FORMAT_CHARACTERS)
"""Unicode's format characters and line and paragraph separators: a page would show text in another order
than it is, hide part of it, or break a line (a terminal gets them escaped, kvbench.printable)."""
_CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f{_INVISIBLE}]")
"""Unicode's control characters (category Cc): C0, DEL and C1; and the invisible ones above."""
_CONTROL_IN_LINES = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_INVISIBLE}]")

_NAMED = {"name", "class", "task"}
"""Keys whose string is a name wherever they are in a run's manifest (the spec's model, task, policy
and protocol, the policy's documentation, the suite)."""


def text_problem(text: str, field: TextField) -> str | None:
    """What makes ``text`` malformed as ``field``, or None."""
    surrogate = _SURROGATE.search(text)
    if surrogate:
        return f"holds a lone surrogate (U+{ord(surrogate.group()):04X}), which is no UTF-8 text"
    control = None if field.any_character else (_CONTROL_IN_LINES if field.lines else _CONTROL).search(text)
    if control:
        allowed = " other than a newline or a tab" if field.lines else ""
        return f"holds the control character U+{ord(control.group()):04X}{allowed}: {field.kind} is text"
    if len(text) > field.limit:
        return f"{len(text):,} characters, over the {field.limit:,} {field.kind} may have ({field.bound})"
    return None


def bundle_field(path: tuple[str, ...]) -> TextField:
    """The class of a string in bundle.json at ``path`` (its keys; a list's items are ``*``)."""
    return {("submitter",): SUBMITTER, ("description",): DESCRIPTION, ("cells", "*", "label"): LABEL}.get(
        path, SHORT
    )


def manifest_field(path: tuple[str, ...]) -> TextField:
    """The class of a string in a run's manifest at ``path``."""
    if path == ("label",):
        return LABEL
    if path[:3] == ("spec", "policy", "params"):
        return PARAMETER
    if path[-1] in _NAMED:
        return NAME
    return SPEC_TEXT


def json_problems(
    value: Any, classify: Callable[[tuple[str, ...]], TextField], path: tuple[str, ...] = (), shown: str = ""
) -> Iterator[tuple[str, str]]:
    """(the field, as ``cells[0].label``; what is wrong) for every malformed string in a JSON value, its
    mapping keys too (a key is a name: a parameter's, a provenance field's). ``classify`` gets the keys
    down to the string, a list's items as ``*``."""
    if isinstance(value, str):
        problem = text_problem(value, classify(path))
        if problem:
            yield shown or "(the whole file)", problem
    elif isinstance(value, dict):
        for key, item in value.items():
            key = str(key)
            field = f"{shown}.{key}" if shown else key
            problem = text_problem(key, NAME)
            if problem:
                yield field, f"its key {problem}"
            yield from json_problems(item, classify, (*path, key), field)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from json_problems(item, classify, (*path, "*"), f"{shown}[{i}]")


SAMPLE_FIELDS = {
    "problem_id": PROBLEM_ID,
    "task": NAME,
    "finish_reason": SHORT,
    "reason": OUTPUT,
    "grader_version": SHORT,
    "output": OUTPUT,
    "secondary": OUTPUT,
}
"""A sample's string columns and their classes (the run id and problem hash are checked as hashes)."""
