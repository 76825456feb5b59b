"""The records kvbench stores, typed once: a sample (one per generated or teacher-forced sample) and a run
(one per cell). The shards' Parquet schema and the DuckDB tables are derived from these models, rows are
inserted by column name, so a field added here appears in all three (tests/results/test_records.py).
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Union, cast

import pyarrow as pa
import pydantic
from pydantic import BaseModel, ConfigDict

from kvbench.specs.resolved import Role
from kvbench.store.manifest import RunManifest

SCHEMA_VERSION = 9
"""Bumped with every change of the records; a store of another version is rebuilt from its shards."""


@dataclass(frozen=True)
class Column:
    """How one field is stored: its Arrow type in the shards and its DuckDB type in the database."""

    arrow: pa.DataType
    sql: str


INT32 = Column(pa.int32(), "INTEGER")
JSON = Column(pa.string(), "JSON")
"""A JSON document, a string in the shards."""
FLOATS = Column(pa.list_(pa.float32()), "FLOAT[]")
"""A short array of numbers (one per layer and KV head)."""
_BY_TYPE = {
    str: Column(pa.string(), "VARCHAR"),
    int: Column(pa.int64(), "BIGINT"),
    float: Column(pa.float64(), "DOUBLE"),
    bool: Column(pa.bool_(), "BOOLEAN"),
    Role: Column(pa.string(), "VARCHAR"),
}


class _Record(BaseModel):
    """A stored record: frozen, with no field its table lacks, and stored as one row of it."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    def row(self) -> dict[str, Any]:
        """The record as one row of its shards and table (JSON fields as text)."""
        row = self.model_dump()
        for name in row:
            if column(type(self), name) is JSON and row[name] is not None:
                row[name] = json.dumps(row[name])
        return row


class SampleRecord(_Record):
    """One sample: a generated answer with its verdict, or a teacher-forced probe with its measurements."""

    run_id: str
    """The cell's identity: a hash of its fully resolved spec."""
    task: str
    problem_id: str
    problem_hash: str
    """sha256 of the problem id, the name of the problem's shard."""
    sample: Annotated[int, INT32]
    """Index of the sample within its problem (0 .. samples per problem − 1)."""
    seed: int
    """The sample's seed: its sampling and every eviction draw derive from it."""
    metric: float | None
    """What the task scores: the grader's score (1/0, or partial credit such as F1), the probe's metric."""
    correct: bool | None
    """The grader's verdict (None for continuous probe metrics)."""
    strict_correct: bool | None
    """Correct and finished before the token cap."""
    finish_reason: str
    """``stop``, ``length`` (the token cap) or ``teacher-forced``."""
    reason: str | None = None
    """Why a graded sample is wrong (the grader's category), None when correct or not graded."""
    generated_tokens: Annotated[int, INT32]
    evictions: Annotated[int, INT32]
    """Eviction events in this sample's cache."""
    no_answer: bool | None = None
    """Graded tasks: no answer could be extracted from the output."""
    grader_version: str | None = None
    """Graded tasks: the version of the grader that gave the verdict."""
    answer_logprob: float | None = None
    """Needle probes: the log-probability of the answer's tokens under the evicted cache."""
    kl_to_full: float | None = None
    """Fidelity probe: mean KL divergence from the full cache's next-token distribution."""
    needle_survival: float | None = None
    """Needle probes: the share of the needle's tokens held, averaged over layers and KV heads, in the
    cache the query's first token attends to."""
    needle_whole_layers: float | None = None
    """Needle probes: the share of layers in which at least one KV head holds the whole needle."""
    needle_survival_by_head: Annotated[list[float] | None, FLOATS] = None
    """Needle probes: the share held by each KV head, layer-major ([L × Hkv] flattened)."""
    needle_high_precision: float | None = None
    """Needle probes under a mixed-precision protocol: the share of the needle's tokens held in the model's
    precision (not quantized), averaged over layers and KV heads, where ``needle_survival`` is read."""
    kv_budget_tokens: Annotated[int, INT32] | None = None
    """K as the cache held it: tokens per KV head right after an event (a byte budget converted)."""
    kv_budget_bytes: int | None = None
    """What K tokens cost for one sequence, all layers and KV heads, quantized tokens packed: the byte
    budget (bytes per cached token = kv_budget_bytes / kv_budget_tokens). None for the full cache."""
    kv_peak_bytes: int | None = None
    """The largest footprint this sample's cache reached (its share of the batch's), measured from the
    cache's tensors."""
    eviction_seconds: float
    """Time spent choosing what to evict, this sample's share of its batch."""
    prompt_held_any: Annotated[list[float] | None, FLOATS] = None
    """Per layer, after the sample's last eviction event: the share of the prompt's tokens held by at least
    one KV head (None without an event; protocol.md, "Retention telemetry")."""
    prompt_held_all: Annotated[list[float] | None, FLOATS] = None
    """Per layer, after the last event: the share of the prompt's tokens held by every KV head."""
    head_coverage: Annotated[list[float] | None, FLOATS] = None
    """Per layer, at the last event: |union of the KV heads' kept positions| / (Hkv · (K − B)); 1/Hkv when
    every head kept the same tokens."""
    kept_by_age: Annotated[list[float] | None, FLOATS] = None
    """At the last event: the kept share of the candidates' (position, KV head) pairs in ten equal age
    buckets of the positions that have been candidates, oldest first, averaged over layers."""
    needle_events: Annotated[int, INT32] | None = None
    """Needle probes: the eviction events at which the whole needle was a candidate before its question."""
    secondary: Annotated[dict[str, Any], JSON] = pydantic.Field(default_factory=dict)
    """Further per-task details no table reads (grader detail, token counts, probe depth)."""
    output: str | None
    """The generated text; None for private tasks and probes."""
    wall_seconds: float


class RunRecord(_Record):
    """One run (a cell): its resolved spec flattened into the columns tables filter on, and provenance."""

    run_id: str
    role: Role
    label: str | None
    adapter: str
    device: str
    dtype: str
    attention: str
    model: str
    task: str
    task_version: Annotated[int, INT32]
    policy: str
    policy_params: Annotated[dict[str, Any], JSON]
    policy_doc: Annotated[dict[str, Any] | None, JSON] = None
    """The policy's documentation as the code that produced these numbers had it."""
    protocol: str
    protection: str
    budget: Annotated[int, INT32] | None
    """K in tokens per KV head; None for the full cache."""
    buffer: Annotated[int, INT32]
    n_avg: float | None
    """The N_avg K was set from: measured on the full-cache arm for ratio budgets on generation tasks,
    else the task's declared value (a probe's trace length)."""
    n_avg_declared: float | None = None
    """The task's declared ``n_avg`` for this model: the planning estimate."""
    n_avg_measured_on: str | None = None
    """The run id of the full-cache arm whose mean generated length is ``n_avg``; None when declared."""
    ratio: float | None
    samples_per_problem: Annotated[int, INT32]
    protocol_seed: int
    visibility: str
    kvbench_version: str | None
    git_sha: str | None
    git_dirty: bool | None
    packages: Annotated[dict[str, Any] | None, JSON]
    hardware: Annotated[dict[str, Any] | None, JSON]
    created: float | None
    spec: Annotated[dict[str, Any], JSON]
    """The whole resolved spec the run id hashes."""

    @classmethod
    def from_manifest(cls, manifest: RunManifest) -> RunRecord:
        spec, git = manifest.spec, manifest.git
        runtime, measurement = spec.ran_on, spec.n_avg_measurement
        doc = manifest.policy_doc
        return cls(
            run_id=manifest.run_id,
            role=manifest.role,
            label=manifest.label,
            adapter=runtime.adapter,
            device=runtime.device,
            dtype=runtime.dtype or spec.model.dtype,
            attention=runtime.attention,
            model=spec.model.name,
            task=spec.task.name,
            task_version=spec.task.version,
            policy=spec.policy.name,
            policy_params=spec.policy.params,
            policy_doc=doc.model_dump(by_alias=True, exclude_unset=True) if doc is not None else None,
            protocol=spec.protocol.name,
            protection=spec.protocol.protection,
            budget=spec.budget,
            buffer=spec.protocol.buffer,
            n_avg=spec.n_avg,
            n_avg_declared=measurement.declared if measurement else spec.n_avg,
            n_avg_measured_on=measurement.reference_run if measurement else None,
            ratio=spec.ratio,
            samples_per_problem=spec.samples,
            protocol_seed=spec.protocol.seed,
            visibility=spec.task.visibility,
            kvbench_version=manifest.kvbench,
            git_sha=git.sha if git else None,
            git_dirty=git.dirty if git else None,
            packages=manifest.packages,
            hardware=manifest.hardware,
            created=manifest.created,
            spec=spec.record(),
        )


def run_table(manifests: Iterable[RunManifest]) -> pa.Table:
    """Runs' manifests as rows of the ``runs`` table."""
    rows = [RunRecord.from_manifest(manifest).row() for manifest in manifests]
    return pa.Table.from_pylist(rows, schema=arrow_schema(RunRecord))


def column(model: type[BaseModel], name: str) -> Column:
    """The storage of one field: its annotated Column, else the one of its Python type."""
    field = model.model_fields[name]
    annotation, markers = field.annotation, list(field.metadata)
    if typing.get_origin(annotation) in (Union, types.UnionType):
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is Annotated:  # Annotated[int, INT32] | None: the marker is inside
        annotation, *inner = typing.get_args(annotation)
        markers += inner
    return next((m for m in markers if isinstance(m, Column)), None) or _BY_TYPE[cast(type, annotation)]


def arrow_schema(model: type[BaseModel]) -> pa.Schema:
    return pa.schema([(name, column(model, name).arrow) for name in model.model_fields])


def table_ddl(model: type[BaseModel], table: str, primary_key: tuple[str, ...]) -> str:
    columns = [f"{name} {column(model, name).sql}" for name in model.model_fields]
    key = ", ".join(primary_key)
    return f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(columns)}, PRIMARY KEY ({key}))"


SAMPLE_SCHEMA = arrow_schema(SampleRecord)
SAMPLE_KEY = ("run_id", "problem_id", "sample")
