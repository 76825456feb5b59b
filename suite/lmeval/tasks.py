"""lm-eval tasks as a kvbench task source (``source: {kind: lm-eval, task: NAME}``).

lm-eval's task manager loads the task: its documents, its prompts (few-shot included), its generation
arguments, its filters and its metric. kvbench's runner then decodes every sample under the policy and
grades each one with the task's own filters and ``process_results``. So the null and full arms, the
paired statistics, the store, ``compare``, ``check`` and the leaderboard all work for any lm-eval
generative task. Every sample is scored, not only the first of lm-eval's ``repeats``.

What enters a cell's identity (:func:`identity`): the lm-eval version, the task's version and a hash of
its resolved config, the documents, the few-shot seed, the generation arguments, the filter and metric.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvbench.errors import PrerequisiteError, SpecError
from kvbench.graders.math import gold_after
from kvbench.runner.generation_units import HubSource
from kvbench.specs.loading import with_overrides
from kvbench.specs.task import LmEvalSource, TaskSpec
from kvbench.specs.task_data import Problem

if TYPE_CHECKING:
    from kvbench.adapters.base import Sampling

LM_EVAL_SEEDS = {"random": 0, "numpy": 1234, "torch": 1234}
"""The global seeds lm-eval's own evaluator sets before it builds tasks (its defaults), set here too, so
that a task whose document processing draws random numbers builds the same documents as under lm-eval."""


@functools.lru_cache(maxsize=4)
def _manager(include: str | None, defaults: bool) -> Any:
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include, include_defaults=defaults)


def _build(source: LmEvalSource, task_name: str) -> Any:
    """The lm-eval task, seeded as lm-eval's evaluator seeds it. The user's folder is searched alone
    first: indexing lm-eval's thousands of built-in tasks takes about 15 s."""
    import numpy as np
    import torch

    random.seed(LM_EVAL_SEEDS["random"])
    np.random.seed(LM_EVAL_SEEDS["numpy"])
    torch.manual_seed(LM_EVAL_SEEDS["torch"])
    managers: list[tuple[str | None, bool]] = [(source.include, False)] if source.include else []
    managers.append((source.include, True))
    for include, defaults in managers:
        manager = _manager(include, defaults)
        if source.task not in manager.all_tasks:
            continue
        try:
            built = manager.load([source.task])["tasks"]
        except (OSError, ConnectionError, ValueError) as exc:
            raise PrerequisiteError(
                f"task {task_name!r}: lm-eval cannot load {source.task!r} ({type(exc).__name__}: {exc}); "
                "its dataset must be reachable: a local path in the lm-eval task's dataset_path, or the "
                "datasets cache of a machine that downloaded it"
            ) from None
        if len(built) != 1:
            raise SpecError(
                f"task {task_name!r}: lm-eval's {source.task!r} is a group of {len(built)} tasks "
                f"({', '.join(sorted(built))}); name one of them"
            )
        task = next(iter(built.values()))
        task.set_fewshot_seed(seed=source.fewshot_seed)
        return task
    where = f" (include: {source.include})" if source.include else ""
    raise SpecError(
        f"task {task_name!r}: lm-eval knows no task {source.task!r}{where}; `lm-eval ls tasks` lists them"
    )


@functools.lru_cache(maxsize=16)
def _loaded(spec_json: str) -> LoadedTask:
    return LoadedTask(TaskSpec.model_validate_json(spec_json))


def loaded(spec: TaskSpec) -> LoadedTask:
    """The lm-eval task behind a spec, built once per process (whatever its generation length and
    samples, which do not change what lm-eval loads)."""
    return _loaded(spec.model_copy(update={"max_new_tokens": 1, "samples": 1}).model_dump_json())


class LoadedTask:
    """An lm-eval task checked against what kvbench's runner can score."""

    def __init__(self, spec: TaskSpec) -> None:
        if not isinstance(spec.source, LmEvalSource):
            raise TypeError(f"task {spec.name!r} is not an lm-eval task")
        self.spec = spec
        self.source: LmEvalSource = spec.source
        self.task = _build(self.source, spec.name)
        config = self.task.config
        if self.task.OUTPUT_TYPE != "generate_until":
            raise SpecError(
                f"task {spec.name!r}: lm-eval's {self.source.task!r} asks for {self.task.OUTPUT_TYPE} "
                "requests; kvbench's runner decodes and grades generative (generate_until) tasks. Run it "
                "with `kvbench lm-eval --model kvbench ...`, where loglikelihood goes through the "
                "teacher-forced path"
            )
        fewshot = self.source.num_fewshot
        self.num_fewshot = fewshot if fewshot is not None else config.num_fewshot
        self.filter = self._filter()
        if spec.grader == "lm-eval":
            self._check_metric()
        self.docs_sha256 = _sha256([doc for _, doc in self.task.doc_iterator()])[:16]
        if _sha256([doc for _, doc in self.task.doc_iterator()])[:16] != self.docs_sha256:  # read again
            raise SpecError(
                f"task {spec.name!r}: lm-eval's {self.source.task!r} gives its documents in a different "
                "order or content each time they are read (an unseeded shuffle in process_docs?): seed it, "
                "or the null and the policy would not see the same problems"
            )

    def _filter(self) -> Any:
        filters = {f.name: f for f in self.task._filters}
        if self.source.filter is not None:
            if self.source.filter not in filters:
                raise SpecError(
                    f"task {self.spec.name!r}: lm-eval's {self.source.task!r} has no filter "
                    f"{self.source.filter!r} (its filters: {', '.join(filters)})"
                )
            return filters[self.source.filter]
        if len(filters) > 1:
            raise SpecError(
                f"task {self.spec.name!r}: lm-eval's {self.source.task!r} has {len(filters)} filters "
                f"({', '.join(filters)}); choose one with `source.filter`"
            )
        return next(iter(filters.values()))

    def _check_metric(self) -> None:
        from lm_eval.api.metrics import mean

        aggregations = self.task.aggregation()
        metric = self.spec.metric
        if metric not in aggregations:
            raise SpecError(
                f"task {self.spec.name!r}: `metric: {metric}` is not a metric of lm-eval's "
                f"{self.source.task!r} (its metrics: {', '.join(aggregations)})"
            )
        if aggregations[metric] is not mean:
            raise SpecError(
                f"task {self.spec.name!r}: lm-eval aggregates {metric!r} with "
                f"{getattr(aggregations[metric], '__name__', aggregations[metric])}, not a mean of "
                "per-sample scores, which kvbench's paired statistics need: choose a metric averaged per "
                "sample"
            )
        if not self.task.higher_is_better().get(metric, True):
            raise SpecError(
                f"task {self.spec.name!r}: lower is better for {metric!r}; kvbench ranks by a score where "
                "higher is better: choose another metric"
            )

    @property
    def generation(self) -> dict[str, Any]:
        return dict(self.task.config.generation_kwargs or {})

    def identity(self) -> dict[str, Any]:
        """What of lm-eval enters every cell's identity and provenance."""
        return {
            "lm_eval_version": importlib.metadata.version("lm_eval"),
            "task": self.source.task,
            "task_version": str(self.task.VERSION),
            "config_sha256": _sha256(self.task.dump_config()),
            "docs_sha256": self.docs_sha256,
            "num_fewshot": self.num_fewshot,
            "fewshot_seed": self.source.fewshot_seed,
            "global_seeds": LM_EVAL_SEEDS,
            "generation_kwargs": self.generation,
            "repeats": self.task.config.repeats,
            "filter": self.filter.name,
        }

    def problems(self, limit: int | None) -> list[Problem]:
        """One problem per document: lm-eval's rendered context, its stop strings and (with
        ``sampling: task``) its sampling; the gold is the document, graded by the task's own metric."""
        from lm_eval.models.utils import normalize_gen_kwargs

        kwargs = normalize_gen_kwargs(self.generation)
        until = kwargs.get("until") or []
        sampling = task_sampling(kwargs) if self.source.sampling == "task" else None
        problems = []
        for doc_id, doc in self.task.doc_iterator(limit=limit):
            context = self.task.fewshot_context(doc, num_fewshot=self.num_fewshot or 0)
            gold = {"doc": doc, "loaded": self}
            if self.spec.grader == "math":
                gold["answer"] = gold_after(str(self.task.doc_to_target(doc)), self.source.answer_after)
            problems.append(
                Problem(
                    str(doc_id),
                    context,
                    gold,
                    stop=tuple(until),
                    sampling=sampling,
                    templated=self.source.chat_template,
                )
            )
        return problems

    def score(self, answer: str, doc: dict[str, Any]) -> dict[str, Any]:
        """The task's metrics of one answer: the task's filter on it, then ``process_results``."""
        from lm_eval.api.instance import Instance

        request = Instance(
            request_type="generate_until",
            doc=doc,
            arguments=("", {}),
            idx=0,
            metadata=(self.source.task, 0, 1),
            resps=[answer],
        )
        self.filter.apply([request])
        filtered = request.filtered_resps[self.filter.name]
        metrics = self.task.process_results(doc, [filtered])
        plain = {k: v.item() if hasattr(v, "item") else v for k, v in metrics.items()}  # numpy scalars: JSON
        return {"filtered": filtered, "metrics": plain}


def task_sampling(kwargs: dict[str, Any]) -> Sampling:
    """lm-eval's generation arguments as kvbench's sampling: greedy unless ``do_sample`` with T > 0."""
    from kvbench.adapters.base import Sampling

    temperature = float(kwargs.get("temperature") or 0.0)
    if not kwargs.get("do_sample") or temperature <= 0:
        return Sampling()
    return Sampling(temperature, float(kwargs.get("top_p") or 1.0), int(kwargs.get("top_k") or 0))


def _sha256(value: Any) -> str:
    """The hex sha256 of a JSON-able value (keys sorted), as lm-eval tasks' identities have stored it."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


class LmEvalTaskSource(HubSource):
    """lm-eval's documents as a task's problems, decoded and graded like a hub dataset's
    (kvbench.runner.sources finds this class by name)."""

    local_data = False

    def resolve(self, task: TaskSpec) -> TaskSpec:
        """The spec with what it leaves to lm-eval filled in: ``max_new_tokens`` from the task's
        ``max_gen_toks`` and ``samples`` from its ``repeats``, unless the kvbench YAML sets them."""
        from lm_eval.models.utils import normalize_gen_kwargs

        lm_eval_task = loaded(task)
        updates: dict[str, Any] = {}
        if "max_new_tokens" not in task.model_fields_set:
            updates["max_new_tokens"] = int(normalize_gen_kwargs(lm_eval_task.generation)["max_gen_toks"])
        if "samples" not in task.model_fields_set:
            updates["samples"] = int(lm_eval_task.task.config.repeats or 1)
        return with_overrides(task, updates, {}) if updates else task

    def identity(self, task: TaskSpec) -> dict[str, Any]:
        """lm-eval's version, the task's version, config and documents."""
        return {"lm_eval": loaded(task).identity()}

    def problems(
        self, task: TaskSpec, backend: Any, limit: int | None, data: Path | None, fingerprint: str | None
    ) -> list[Problem]:
        if data is not None:
            raise SpecError(
                f"task {task.name!r} reads an lm-eval task, whose YAML names its data: --data does not apply"
            )
        return loaded(task).problems(limit)
