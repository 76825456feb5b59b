"""Problems of hub-dataset tasks: loaded with `datasets`, from the hub or a local copy in the same format.

The one code path serves both: ``datasets.load_dataset`` takes the hub id at the task's pinned revision,
or, with ``--data PATH``, a local folder laid out like the hub repository (the tests use such fixtures;
air-gapped users use their own copy).
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.errors import PrerequisiteError, SpecError
from kvbench.graders.registry import make_grader
from kvbench.specs.task import HubDataset, TaskSpec

SHOWN_ROWS = 5
"""Rows named in an error about a column's values; the count covers them all."""


@dataclass(frozen=True)
class Problem:
    problem_id: str
    prompt: str
    """The user turn (never stored for private tasks)."""
    gold: dict[str, Any] = field(default_factory=dict)
    stop: tuple[str, ...] = ()
    """Strings that end a sample (an lm-eval task's ``until``); the model's stop tokens always do."""
    sampling: Any = None
    """A Sampling that replaces the protocol's (an lm-eval task decoded with its own arguments)."""
    templated: bool = True
    """The prompt goes through the model's chat template as one user turn; False: raw text."""

    def encoded(self, backend: Any) -> list[int]:
        """The prompt's token ids on ``backend``."""
        return backend.prompt_ids(self.prompt) if self.templated else backend.encode(self.prompt)


def _load(source: HubDataset, where: dict[str, Any], cache_dir: str | None) -> Any:
    import datasets

    return datasets.load_dataset(
        **where, name=source.config, split=source.split, data_files=source.data_files, cache_dir=cache_dir
    )


def _local_rows(task: TaskSpec, source: HubDataset, data: Path, fingerprint: str | None) -> Any:
    """A local copy's rows, read from a private snapshot of the folder and never through a shared cache.

    `datasets` caches a local folder by its name, not its content: an edited copy (or another folder of
    the same name) would silently load stale rows, and private text would stay in the shared cache. The
    folder is copied, the copy is fingerprinted (it must be what the run's identity recorded), and the
    rows are built in a throwaway cache that is deleted with the copy.
    """
    with tempfile.TemporaryDirectory(prefix="kvbench-data-") as scratch:
        copy = Path(scratch) / "data"
        if data.is_dir():
            shutil.copytree(data, copy)
        else:
            copy.mkdir()
            shutil.copy2(data, copy / data.name)
        if (
            fingerprint is not None
            and data_fingerprint(copy if data.is_dir() else copy / data.name) != fingerprint
        ):
            raise SpecError(
                f"task {task.name!r}: --data {data} changed after this run was planned (its fingerprint "
                f"is no longer {fingerprint}): run the command again"
            )
        try:
            rows = _load(source, {"path": str(copy)}, cache_dir=str(Path(scratch) / "cache"))
        except Exception as exc:  # datasets raises many kinds on a malformed file; all mean the same here
            raise SpecError(
                f"task {task.name!r}: cannot load --data {data} as the {source.dataset} dataset "
                f"(split {source.split!r}): {type(exc).__name__}: {exc}. Give a copy in the hub's layout"
            ) from None
        return [dict(row) for row in rows]


def _rows(
    task: TaskSpec, source: HubDataset, data: Path | None, fingerprint: str | None = None
) -> list[tuple[int, dict[str, Any]]]:
    """(index in the split, row) of each row the task's ``where`` keeps."""
    if data is not None:
        rows = _local_rows(task, source, data, fingerprint)
    else:
        try:
            rows = _load(source, {"path": source.dataset, "revision": source.revision}, cache_dir=None)
        except (ConnectionError, FileNotFoundError, OSError, ValueError) as exc:
            raise PrerequisiteError(
                f"task {task.name!r} ({source.dataset} at revision {source.revision}) is not available "
                f"offline ({type(exc).__name__}): {fetch_advice(source)}"
            ) from None
    return [
        (index, dict(row))
        for index, row in enumerate(rows)
        if all(str(row.get(k)) == v for k, v in source.where.items())
    ]


def fetch_advice(source: HubDataset) -> str:
    """The commands that make a hub dataset loadable offline: kvbench's own load_dataset call, which fills
    the datasets cache (what an offline load_dataset reads; a download into the hub's file cache alone is
    not read offline), or a copy in the hub's layout for --data."""
    arguments = [json.dumps(source.dataset)]
    if source.config is not None:
        arguments.append(f"name={json.dumps(source.config)}")
    arguments += [f"split={json.dumps(source.split)}", f"revision={json.dumps(source.revision)}"]
    if source.data_files is not None:
        arguments.append(f"data_files={json.dumps(source.data_files)}")
    load = f"import datasets; datasets.load_dataset({', '.join(arguments)})"
    folder = source.dataset.replace("/", "--")
    return (
        "on a machine with network, fill the datasets cache (HF_HOME or HF_DATASETS_CACHE as the run's) "
        f"with\n    python -c {shlex.quote(load)}\nor download a copy in the hub's layout and pass it "
        f"with --data {folder}:\n    hf download --repo-type dataset {source.dataset} --revision "
        f"{source.revision} --local-dir {folder}\n(a gated dataset needs `hf auth login` first)"
    )


def _blank(value: Any) -> bool:
    """A value that would reach a prompt or a gold answer as 'None', 'nan' or nothing at all."""
    if isinstance(value, float):
        return math.isnan(value)
    return value is None or (isinstance(value, str) and not value.strip())


def _check_rows(task: TaskSpec, rows: list[tuple[int, dict[str, Any]]], origin: str) -> None:
    """There are rows; each holds every column the task reads; the id, question and answer columns (and a
    choice task's options) hold a value in every row: not missing, not null, not empty or whitespace."""
    source = task.dataset
    fields = source.fields
    if not rows:
        kept = f" that `where` keeps ({source.where})" if source.where else ""
        raise SpecError(
            f"task {task.name!r}: {origin} has no rows{kept} in split {source.split!r}: give a copy with "
            "the task's problems, or fix the task's `split` or `where`"
        )
    read = {f"fields.{name}": getattr(fields, name) for name in ("id", "question", "answer", "correct")}
    read |= {f"fields.incorrect[{i}]": column for i, column in enumerate(fields.incorrect or [])}
    valued = {name: column for name, column in read.items() if column is not None}
    needed = [*valued.values(), *(fields.tests or [])]  # a code task's tests may be empty in a row
    missing = sorted({c for c in needed if c not in rows[0][1]})
    if missing:
        raise SpecError(
            f"task {task.name!r}: {origin} has no column(s) {', '.join(missing)} (columns: "
            f"{', '.join(rows[0][1])}): give a copy in the hub's layout, or fix the task's `fields`"
        )
    problems = []
    for name, column in valued.items():
        blank = [str(index) for index, row in rows if _blank(row.get(column))]
        if blank:
            shown = ", ".join(blank[:SHOWN_ROWS]) + (", ..." if len(blank) > SHOWN_ROWS else "")
            rows_named = f"row {shown}" if len(blank) == 1 else f"rows {shown} ({len(blank)} in all)"
            problems.append(f"  column {column!r} (`{name}`): {rows_named}")
    if problems:
        raise SpecError(
            f"task {task.name!r}: {origin} has rows without a value the task reads (missing, null, empty or "
            f"only whitespace; rows counted from 0 in split {source.split!r}):\n" + "\n".join(problems) + "\n"
            "Fill in those values or remove those rows: they would reach the prompts and gold answers as "
            "'None' or empty text"
        )


def check_data(task: TaskSpec, data: Path) -> None:
    """Refuse a local copy whose rows the task cannot read, before anything loads (`kvbench run --data`)."""
    _check_rows(task, _rows(task, task.dataset, data), f"--data {data}")


def load_problems(
    task: TaskSpec, data: Path | None = None, limit: int | None = None, fingerprint: str | None = None
) -> list[Problem]:
    """The task's problems (at most ``limit``); with ``data``, from that local copy, which must still have
    ``fingerprint`` (the one the run's identity recorded) when one is given."""
    source = task.dataset
    fields = source.fields
    problems = []
    rows = _rows(task, source, data, fingerprint)
    origin = f"--data {data}" if data is not None else f"{source.dataset} at {source.revision}"
    _check_rows(task, rows, origin)
    grader = make_grader(task.grader)
    for index, (_, row) in enumerate(rows):
        problem_id = str(row[fields.id]) if fields.id else f"{source.split}-{index}"
        prompt, gold = grader.problem(task, row, problem_id, str(row[fields.question]))
        problems.append(Problem(problem_id, prompt, gold))
        if limit is not None and len(problems) >= limit:
            break
    return problems


def data_fingerprint(path: Path) -> str:
    """A hash of a local data folder's files: part of a run's identity when --data replaces the hub."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]
