"""``kvbench grade RUN``: grade a run's stored outputs again (after a grader fix), without regenerating.

Each problem's shard is rewritten (atomically) with the new verdicts and the grader version that gave
them; ingest then replaces those rows. Private tasks store no output, so they cannot be re-graded:
rerun them instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import SpecError
from kvbench.graders.registry import check_code_execution, make_grader
from kvbench.runner.generation_units import graded_fields
from kvbench.runner.sources import task_source
from kvbench.specs.model import load_model_spec, model_names
from kvbench.store.manifest import RunManifest
from kvbench.store.shards import ShardStore, read_records


@dataclass(frozen=True)
class RegradeReport:
    run_id: str
    samples: int
    changed: int


def find_run(root: Path, run: str) -> Path:
    matches = [p for p in (root / "shards").glob(f"{run}*") if (p / "manifest.json").is_file()]
    if len(matches) != 1:
        known = sorted(p.name for p in (root / "shards").glob("*") if p.is_dir())
        raise SpecError(
            f"run {run!r} matches {len(matches)} runs under {root / 'shards'}; known: {', '.join(known)}"
        )
    return matches[0]


def regrade(root: Path, run: str, *, allow_code_execution: bool = False) -> RegradeReport:
    folder = find_run(root, run)
    manifest = RunManifest.read(folder / "manifest.json")
    spec = manifest.spec
    task = spec.task
    if task_source(task).teacher_forced:
        raise SpecError(f"run {folder.name} is a probe ({task.name}): its scores are not graded outputs")
    if task.visibility == "private":
        raise SpecError(f"task {task.name!r} is private: its outputs were never stored; rerun it instead")
    check_code_execution([task], allow_code_execution)
    grader = make_grader(task.grader)
    data = Path(spec.data.path) if spec.data is not None else None
    problems = {p.problem_id: p for p in task_source(task).problems(task, None, None, data, None)}
    thinking = manifest.thinking
    if thinking is None:  # a run from before its manifest recorded it: its model's spec says
        shipped = spec.model.name in model_names()
        thinking = load_model_spec(spec.model.name).thinking if shipped else spec.model.thinking
    store = ShardStore(root, folder.name)
    samples = changed = 0
    try:
        for shard in sorted(folder.glob("*.parquet")):
            records = read_records(shard)
            regraded = []
            for record in records:
                if record.output is None:
                    raise SpecError(
                        f"{shard}: sample {record.problem_id}/{record.sample} has no stored output"
                    )
                gold = problems[record.problem_id].gold
                verdict = grader.grade(record.output, gold, task, thinking=thinking)
                changed += int(verdict.correct != record.correct)
                fields = graded_fields(verdict, record.output, record.finish_reason, task)
                regraded.append(record.model_copy(update=fields))
                samples += 1
            store.write(records[0].problem_id, regraded)
    finally:
        grader.close()
    return RegradeReport(folder.name, samples, changed)
