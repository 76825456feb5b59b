"""Task specs (tasks/*.yaml): where problems come from, how they are scored, and their reference N_avg."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic

from kvbench.errors import UnknownNameError
from kvbench.specs.loading import StrictSpec, find_spec_file, load_spec, spec_names
from kvbench.specs.protocol import MAX_TOKENS

Depth = Annotated[int, pydantic.Field(ge=0, le=MAX_TOKENS)]


class ProbeSource(StrictSpec):
    """Seeded synthetic probes (protocol.md, section 7), teacher-forced through the decode path."""

    kind: Literal["probe"]
    probe: Literal["passkey", "planted-fact", "fidelity"]
    problems: int = pydantic.Field(gt=0, le=1 << 20)
    """How many problems a run generates when no ``--limit`` (or suite ``limit``) is given; a limit, above
    or below it, generates that many instead (problem i depends on its index only)."""
    length: int = pydantic.Field(gt=0, le=MAX_TOKENS)
    """Tokens of the teacher-forced trace (prompt excluded): the task's N_avg."""
    depth: Depth = 0
    """Filler tokens between the needle and its query (needle probes), inside the trace of ``length``
    tokens beside the needle, the query and the answer."""
    depths: list[Depth] | None = pydantic.Field(default=None, min_length=1, exclude_if=lambda v: v is None)
    """Instead of ``depth``, several: problem i takes depths[i mod len(depths)], so that recall can be read
    against the distance (left out of the identity when not given: runs stored before it keep theirs)."""
    pin_heads: int | None = pydantic.Field(default=None, ge=0)
    """planted-fact ablation: protect the needle's slots in exactly this many KV heads of every layer."""
    seed: int = pydantic.Field(default=0, ge=0, lt=1 << 63)

    @pydantic.field_validator("depth")
    @classmethod
    def _depth_inside_the_trace(cls, depth: int, info: pydantic.ValidationInfo) -> int:
        """A needle's depth lies inside the trace: a depth beyond it would lengthen the trace past
        ``length`` (the task's N_avg) without a word. The exact room, which depends on how many tokens the
        needle and the query take, is checked when a model's tokenizer lays the probe out."""
        probe, length = info.data.get("probe"), info.data.get("length")
        if probe == "fidelity" and depth:
            raise ValueError(f"a fidelity probe has no needle, so `depth` ({depth}) is never read: remove it")
        if probe is not None and length is not None and depth >= length:
            raise ValueError(
                f"`depth` {depth} does not fit in `length` {length}: depth counts the filler tokens between "
                "the needle and its query inside the trace of `length` tokens, which also holds the needle, "
                f"the query, the answer and filler before the needle; lower `depth` (the built-in probes put "
                f"it at half of `length`: {length // 2}) or raise `length` (to about {2 * depth} for the "
                "same proportions)"
            )
        return depth

    @pydantic.field_validator("depths")
    @classmethod
    def _depths_instead_of_depth(
        cls, depths: list[int] | None, info: pydantic.ValidationInfo
    ) -> list[int] | None:
        if depths is None:
            return None
        if info.data.get("depth"):
            raise ValueError("give `depth` or `depths`, not both: remove `depth`")
        for depth in depths:
            cls._depth_inside_the_trace(depth, info)
        return depths

    def depth_of(self, index: int) -> int:
        """The depth of problem ``index``."""
        return self.depths[index % len(self.depths)] if self.depths is not None else self.depth

    @pydantic.field_validator("pin_heads")
    @classmethod
    def _pins_a_needle(cls, pin_heads: int | None, info: pydantic.ValidationInfo) -> int | None:
        if pin_heads is not None and info.data.get("probe") == "fidelity":
            raise ValueError(
                f"a fidelity probe has no needle, so `pin_heads` ({pin_heads}) has nothing to pin: remove it"
            )
        return pin_heads


class Fields(StrictSpec):
    """Which columns of the dataset hold what."""

    id: str | None = None
    """The id column; without one the row index in the pinned revision is the id."""
    question: str
    answer: str | None = None
    """Math: the gold answer."""
    answer_after: str | None = None
    """Math: keep only the text after this marker of the answer column (GSM8K's '####')."""
    correct: str | None = None
    """Choice: the correct option (shown shuffled, never first by construction)."""
    incorrect: list[str] | None = None
    """Choice: the incorrect options."""
    tests: list[str] | None = None
    """Code: the columns holding test cases (JSON, or base64+zlib+pickled JSON as LiveCodeBench ships)."""
    metadata: str | None = None
    """Code: the JSON column naming the method of functional problems (``func_name``)."""
    starter_code: str | None = None
    """Code: the column holding the class/method skeleton of functional problems."""


class HubDataset(StrictSpec):
    """A Hugging Face dataset at a pinned revision, loaded with `datasets` (or a local copy: --data)."""

    kind: Literal["hub-dataset"]
    dataset: str
    revision: str
    config: str | None = None
    split: str = "test"
    data_files: dict[str, list[str]] | None = None
    """Raw files per split, read directly (LiveCodeBench's loading script no longer runs on datasets 4+)."""
    fields: Fields
    where: dict[str, str] = pydantic.Field(default_factory=dict)
    """Keep rows whose column equals this value (e.g. difficulty: medium)."""


class LmEvalSource(StrictSpec):
    """A generative task of lm-evaluation-harness, loaded by lm-eval's task manager (kvbench.lmeval.tasks):
    its documents, prompts, generation arguments, filters and metric."""

    kind: Literal["lm-eval"]
    task: str
    """The lm-eval task's name (``lm-eval ls tasks``), built in or in ``include``."""
    include: str | None = None
    """A folder of the user's lm-eval task YAMLs (relative to this file), searched before lm-eval's own."""
    filter: str | None = None
    """The lm-eval filter whose output is graded (e.g. ``strict-match``); required when the task has
    several."""
    num_fewshot: int | None = pydantic.Field(default=None, ge=0)
    """Few-shot examples; default: the lm-eval task's own setting."""
    fewshot_seed: int = pydantic.Field(default=1234, ge=0)
    """The seed of the few-shot sampler (lm-eval's default)."""
    chat_template: bool = True
    """Send lm-eval's rendered context as one user turn through the model's chat template (as every
    kvbench task does); false sends the raw context, as lm-eval does without --apply_chat_template."""
    sampling: Literal["task", "protocol"] = "task"
    """Decode with the lm-eval task's generation arguments (``task``), or with the protocol's sampling for
    the model family (``protocol``). The null and full arms always use the same."""
    answer_after: str | None = None
    """With ``grader: math``: grade against the text after this marker of the task's target."""


class InstalledSource(pydantic.BaseModel):
    """A task source that an installed package adds (entry-point group ``kvbench.task_sources``, checked
    when a run is planned): ``kind`` names it, its other fields are its own and join the identity."""

    model_config = pydantic.ConfigDict(extra="allow", frozen=True)
    kind: str


def _source_tag(source: Any) -> str:
    kind = source.get("kind") if isinstance(source, dict) else getattr(source, "kind", None)
    return kind if kind in ("probe", "hub-dataset", "lm-eval") else "installed"


Source = Annotated[
    Annotated[ProbeSource, pydantic.Tag("probe")]
    | Annotated[HubDataset, pydantic.Tag("hub-dataset")]
    | Annotated[LmEvalSource, pydantic.Tag("lm-eval")]
    | Annotated[InstalledSource, pydantic.Tag("installed")],
    pydantic.Discriminator(_source_tag),
]


class TaskSpec(StrictSpec):
    spec_version: Literal[1] = 1
    name: str
    version: int = pydantic.Field(default=1, ge=1)
    """Bump when problems, prompts or scoring change: it is part of every result's identity."""
    description: str
    source: Source
    metric: str
    """The primary metric, higher is better (e.g. exact retrieval, top-1 agreement with the full cache)."""
    grader: str = "probe"
    """``probe`` (teacher-forced probes) or a registered grader: math, choice, code; lm-eval sources use
    ``lm-eval`` (the task's own filters and metric, ``metric`` naming one) or ``math``."""
    answer_kind: Literal["latex", "integer"] = "latex"
    """Math: how the gold answer is parsed (integer for AIME, LaTeX for MATH-500)."""
    prompt: str = "{question}"
    """The user turn: the placeholders {question} and (choice tasks) {choices} are replaced; nothing else
    is interpreted, so LaTeX braces such as \\boxed{} stay as written."""
    max_new_tokens: int = pydantic.Field(default=32768, gt=0, le=MAX_TOKENS)
    samples: int = pydantic.Field(default=1, gt=0, le=4096)
    """Samples per problem; the samples of one problem decode as one batch."""
    visibility: Literal["public", "private"] = "public"
    """Private tasks never store or show problem or output text."""
    n_avg: dict[str, Annotated[float, pydantic.Field(gt=0, le=MAX_TOKENS)]] = pydantic.Field(
        default_factory=dict
    )
    """Reference mean generated length per model name; '*' applies to any model."""
    licence: str = "self-written synthetic data"
    margins: dict[str, Annotated[float, pydantic.Field(gt=0.0, allow_inf_nan=False)]] = pydantic.Field(
        default_factory=dict, exclude_if=lambda v: not v
    )
    """Equivalence margins in each metric's own units, by metric name: the task's ``metric`` (its
    grader's ``pass@1``, a probe's ``exact`` or ``top1_agreement``) or, on a needle probe, a quantity
    `--metric` ranks by (``answer_logprob``, ``needle_survival``, ``needle_whole_layers``). A metric
    left out uses the protocol's ``margin`` when its scores lie in [0, 1], and has no equivalence test
    when they do not (kvbench.specs.metric_kind.equivalence_margin). Left out of the identity when
    empty, so runs stored before it existed keep their ids."""

    @pydantic.field_validator("margins")
    @classmethod
    def _margins_of_this_tasks_metrics(
        cls, margins: dict[str, float], info: pydantic.ValidationInfo
    ) -> dict[str, float]:
        from kvbench.specs.metric_kind import check_margins

        source, metric = info.data.get("source"), info.data.get("metric")
        if source is None or metric is None:  # already refused, with its own error
            return margins
        check_margins(margins, source, info.data.get("grader", "probe"), metric)
        return margins

    @pydantic.model_validator(mode="before")
    @classmethod
    def _lm_eval_grades_its_own(cls, data: Any) -> Any:
        """An lm-eval source is graded by the lm-eval task's own metric unless the YAML says otherwise."""
        source = data.get("source") if isinstance(data, dict) else None
        if isinstance(source, dict) and source.get("kind") == "lm-eval" and "grader" not in data:
            return {**data, "grader": "lm-eval"}
        return data

    @pydantic.model_validator(mode="after")
    def _grader_fits_source(self, info: pydantic.ValidationInfo) -> TaskSpec:
        from kvbench.graders.registry import COMMON_FIELDS, GRADERS, LM_EVAL, PROBE

        if (info.context or {}).get("stored"):  # read back (kvbench.specs.resolved), maybe without its grader
            return self
        installed = isinstance(self.source, InstalledSource)  # a probe grader: the source scores itself
        if not installed and (self.grader == PROBE) != (self.source.kind == "probe"):
            raise ValueError(f"grader {self.grader!r} does not fit a {self.source.kind!r} source")
        if (self.grader == LM_EVAL) and self.source.kind != "lm-eval":
            raise ValueError(f"grader {LM_EVAL!r} grades lm-eval sources, not a {self.source.kind!r} source")
        if self.source.kind == "lm-eval":
            if self.grader not in (LM_EVAL, "math"):
                raise ValueError(f"an lm-eval source is graded by 'lm-eval' or 'math', not {self.grader!r}")
            if self.prompt != "{question}":
                raise ValueError("an lm-eval source renders its own prompts: remove `prompt`")
        if installed and self.grader != PROBE and self.grader not in GRADERS:
            raise ValueError(str(GRADERS.unknown(self.grader)))
        if isinstance(self.source, HubDataset):
            try:
                grader = GRADERS.get(self.grader)
            except UnknownNameError as exc:
                raise ValueError(str(exc)) from None
            needed = grader.fields
            unset = [f"`fields.{f}`" for f in needed if not getattr(self.source.fields, f)]
            if unset:
                raise ValueError(f"a {self.grader} task needs {' and '.join(unset)}")
            read = {*COMMON_FIELDS, *needed, *grader.optional}
            given = self.source.fields
            unread = sorted(f for f in given.model_fields_set - read if getattr(given, f) is not None)
            if unread:
                raise ValueError(
                    f"the {self.grader} grader does not read {', '.join(f'`fields.{f}`' for f in unread)}: "
                    f"remove it (a {self.grader} task's fields: {', '.join(sorted(read))})"
                )
        return self

    @property
    def probe(self) -> ProbeSource:
        """The source of a probe task (a teacher-forced probe)."""
        if not isinstance(self.source, ProbeSource):
            raise TypeError(f"task {self.name!r} reads a hub dataset, not a probe")
        return self.source

    @property
    def dataset(self) -> HubDataset:
        """The source of a graded task (a dataset of problems)."""
        if not isinstance(self.source, HubDataset):
            raise TypeError(f"task {self.name!r} is a probe, not a dataset of problems")
        return self.source

    @property
    def scored_from_first_eviction(self) -> bool:
        """Whether a sample's score covers only what follows the first eviction event, which is at K + B:
        then even the full cache's scores depend on K (the fidelity probe)."""
        return isinstance(self.source, ProbeSource) and self.source.probe == "fidelity"

    def reference_n_avg(self, model: str) -> float | None:
        declared = self.n_avg.get(model, self.n_avg.get("*"))
        if declared is None and isinstance(self.source, ProbeSource):
            return float(self.source.length)
        return declared


def task_names() -> list[str]:
    return spec_names("tasks")


def load_task(name_or_path: str | Path) -> TaskSpec:
    path = find_spec_file("task", "tasks", str(name_or_path))
    spec = load_spec(path, TaskSpec)
    source = spec.source
    if isinstance(source, LmEvalSource) and source.include and not Path(source.include).is_absolute():
        # relative to the task's YAML, wherever the command runs
        include = str((path.parent / source.include).resolve())
        spec = spec.model_copy(update={"source": source.model_copy(update={"include": include})})
    return spec
