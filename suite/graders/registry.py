"""Graders by name: a task's ``grader:`` selects one. A grader owns the dataset columns it reads, how a
problem's prompt and gold answer are built from a dataset row, and how an output is graded.

The built-ins' names and the columns each requires are listed here without importing the graders, so that
loading a task spec never imports grading code (math-verify, the sandbox); :func:`make_grader` imports
the one a run uses. A package adds a grader under the entry-point group ``kvbench.graders``, naming its
class, whose ``fields``, ``optional`` and ``sandboxed`` say what :class:`GraderEntry` records.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvbench.errors import SpecError
from kvbench.plugins import Registry


@dataclass(frozen=True)
class GraderVerdict:
    """A grader's verdict on one sample: right or wrong for the math, choice and code graders (1 when
    correct, else 0); lm-eval's metric may also give partial credit."""

    correct: bool
    """Full credit: the metric's maximum of 1 (exact match, accuracy); a partial score is not correct."""
    no_answer: bool
    detail: str | None
    """What the grader read as the answer (a letter, an expression, lm-eval's filtered answer), or why the
    first test failed (the code itself is kept in the output)."""
    version: str
    failure: str | None = None
    """Why it is wrong when that is more than a missing or wrong answer: a grader timeout, which test
    failed and how."""
    metric: float | None = None
    """The task's metric when it is more than right or wrong (lm-eval's); None: the score is ``correct``."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Secondary fields stored with the sample (every metric an lm-eval task computed)."""

    @property
    def score(self) -> float:
        """The sample's value of the task's metric: 1 when correct, else 0, unless ``metric`` says."""
        return float(self.correct) if self.metric is None else self.metric

    @property
    def reason(self) -> str | None:
        """Why the sample is not correct (None when it is)."""
        if self.correct:
            return None
        if self.failure:
            return self.failure
        return "no answer" if self.no_answer else "partial credit" if self.score > 0 else "wrong answer"


class Grader(Protocol):
    """What the runner asks of a grader (for the generating tasks; probes score themselves). A grader that
    holds nothing subclasses it for its ``close`` (and an installed one for the defaults of what its entry
    records: the task fields it needs, and reads when set, and whether it runs model-written programs)."""

    fields: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    sandboxed: bool = False

    def problem(self, task: Any, row: dict[str, Any], problem_id: str, question: str) -> tuple[str, dict]:
        """The user prompt and the gold answer of one dataset row."""
        ...

    def grade(self, output: str, gold: dict[str, Any], task: Any, *, thinking: bool) -> GraderVerdict: ...

    def close(self) -> None:
        """Release what grading holds (worker processes); nothing by default."""
        return None


@dataclass(frozen=True)
class GraderEntry:
    target: str
    """module:class of the grader."""
    fields: tuple[str, ...]
    """The task's ``fields`` it needs set (dataset columns)."""
    optional: tuple[str, ...] = ()
    """Further ``fields`` it reads when set; any other grader's field is an error in a task's YAML."""
    sandboxed: bool = False
    """Grading runs model-written programs: refused without --allow-code-execution and a sandbox."""


def _installed(cls: Any, target: str) -> GraderEntry:
    return GraderEntry(target, tuple(cls.fields), tuple(cls.optional), bool(cls.sandboxed))


LM_EVAL = "lm-eval"
"""The grader of lm-eval sources: the lm-eval task's own filters and metric."""
PROBE = "probe"
"""Not a grader: probe tasks are scored by teacher forcing (kvbench.runner.probe_units)."""
GRADERS: Registry[GraderEntry] = Registry(
    "grader",
    "kvbench.graders",
    {
        "math": GraderEntry("kvbench.graders.math:MathGrader", ("answer",), ("answer_after",)),
        "choice": GraderEntry("kvbench.graders.choice:ChoiceTaskGrader", ("correct", "incorrect")),
        "code": GraderEntry(
            "kvbench.graders.code:CodeTaskGrader", ("tests",), ("metadata", "starter_code"), sandboxed=True
        ),
        LM_EVAL: GraderEntry("kvbench.lmeval.grading:LmEvalGrader", ()),
    },
    _installed,
    also_known=(PROBE,),
)
COMMON_FIELDS = ("id", "question")
"""The ``fields`` every grader reads: the problem's id and its question."""


def sandboxed(grader: str) -> bool:
    """Whether a task's grader runs model-written programs (``probe`` does not)."""
    return grader != PROBE and GRADERS.get(grader).sandboxed


def check_code_execution(tasks: Iterable[Any], allowed: bool) -> None:
    """Tasks (specs) that run model-written code need the user's consent and a working sandbox, checked
    before any model loads: no weaker sandbox exists to fall back to."""
    running_code = [t.name for t in tasks if sandboxed(t.grader)]
    if running_code and not allowed:
        raise SpecError(
            f"task(s) {', '.join(running_code)} run model-written code (each test inside a bubblewrap "
            "sandbox: no network, no host files, CPU, memory, process and wall-clock limits): pass "
            "--allow-code-execution to run them"
        )
    if running_code:
        from kvbench.graders.sandbox import Sandbox

        Sandbox().check()


def make_grader(name: str) -> Grader:
    return pkgutil.resolve_name(GRADERS.get(name).target)()


class Graders(dict[str, Grader]):
    """One grader per name for a whole run (the math grader keeps a worker process), closed at its end."""

    def __missing__(self, name: str) -> Grader:
        self[name] = made = make_grader(name)
        return made

    def close(self) -> None:
        for grader in self.values():
            grader.close()
