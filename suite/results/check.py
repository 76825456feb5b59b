"""``kvbench check``: a suite's results against the committed reference results in runs/reference/.

Each cell (model, task, policy with its parameters, role, budget) is compared with its reference:

- **regressed** (fails): the score fell below the reference by more than the tolerance, which comes
  from the two confidence intervals: sqrt(h_ref² + h_now²), h the half-width of each 95% CI. A noisy
  cell (few problems, spread-out scores) tolerates more than a tight one; nothing is a fixed constant.
- **spec changed** (fails): the cell's identity (the hash of its resolved spec) is not the reference's.
- **changed, code unchanged** (fails): on the deterministic CPU suite the cell's outputs (every
  sample's metric, verdict, length and text) differ although its spec, the policy's source file, the
  library versions, Python, the CPU model and torch's thread count did not: the engine, the runner or
  a model changed behaviour.
- **changed with the environment** (reported): the same, but the environment differs from the
  reference's (a fresh venv may resolve newer libraries); the differences are named.
- **changed with its code** (reported): the policy's source changed, and so did its outputs, within
  the tolerance (or upwards).
- **pairing changed** (fails): a policy cell is paired (kvbench.results.pairing) with another null or
  full-cache cell than the reference's was.
- **no reference** (fails): a cell the reference does not have; **dropped** (fails): the reverse.

A suite whose spec (description aside) differs from the one the reference was written from fails too.

``--update-reference`` writes the results with a manifest: the suite, its spec hash, versions,
hardware, git commit and date.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import duckdb

from kvbench.errors import SpecError
from kvbench.store.atomic import atomic_write
from kvbench.store.manifest import Provenance

FORMAT_VERSION = 2


@dataclass(frozen=True)
class CellResult:
    key: str
    """model/task/protocol/policy{params}/role@K: how a cell is matched with its reference."""
    identity: str
    """The cell's run id: a hash of its fully resolved spec (model, task, protocol, policy, runner)."""
    score: float
    low: float
    high: float
    problems: dict[str, float]
    outputs: str
    """sha256 over every sample's metric, verdicts, finish reason, length, evictions, text and its
    secondary measurements (timings left out)."""
    code: str
    """sha256 of the policy's source file."""
    null: str | None = None
    """A policy cell's null, by key, as kvbench.results.pairing pairs them (None: not a policy cell)."""
    full: str | None = None
    """A policy cell's full cache, by key, likewise."""

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


Status = Literal[
    "same",
    "regressed",
    "spec changed",
    "changed, code unchanged",
    "changed with the environment",
    "changed with its code",
    "pairing changed",
    "no reference",
    "dropped",
]


@dataclass(frozen=True)
class Finding:
    key: str
    status: Status
    fails: bool
    reference: CellResult | None
    now: CellResult | None
    tolerance: float | None = None
    detail: str = ""


_OUTPUTS = """
SELECT problem_id, sample, metric, correct, strict_correct, finish_reason, generated_tokens, evictions,
       output, secondary, no_answer, grader_version, answer_logprob, kl_to_full, needle_survival,
       needle_whole_layers
FROM samples WHERE run_id = ? ORDER BY problem_id, sample
"""
# The measurements that have their own columns, under the names the digest has always used for them
# (they were keys of `secondary` until schema 5): the reference's digests stay comparable.
_MEASURED = ("no_answer", "grader", "answer_logprob", "kl_to_full", "needle_survival", "needle_whole_layers")


def outputs_digest(con: duckdb.DuckDBPyConnection, run_id: str) -> str:
    """sha256 (16 hex digits) over a run's samples: what `kvbench check` compares with its reference."""
    digest = hashlib.sha256()
    for row in con.execute(_OUTPUTS, [run_id]).fetchall():
        problem, sample, metric, *verdict_to_output, secondary = row[: -len(_MEASURED)]
        rounded = None if metric is None else round(metric, 12)
        measured = dict(zip(_MEASURED, row[-len(_MEASURED) :], strict=True))
        present = {k: v for k, v in measured.items() if v is not None}
        # correct, strict_correct, finish_reason, generated_tokens, evictions, output: in _OUTPUTS' order
        fields = (problem, sample, rounded, *verdict_to_output, _measurements(secondary, present))
        digest.update(repr(fields).encode())
    return digest.hexdigest()[:16]


def _measurements(secondary: str | None, measured: dict[str, Any]) -> str:
    """A sample's measurements (KL to the full cache, the answer's log-probability, ...) and further
    details, without its wall-clock timings, which no two runs share."""
    values = {**json.loads(secondary or "{}"), **measured}
    kept = {
        key: round(value, 9) if isinstance(value, float) else value
        for key, value in values.items()
        if not key.endswith("seconds")
    }
    return json.dumps(kept, sort_keys=True)


def compare_with_reference(
    now: list[CellResult], reference: list[CellResult], environment_changes: list[str]
) -> list[Finding]:
    findings = []
    known = {r.key: r for r in reference}
    for result in now:
        ref = known.pop(result.key, None)
        if ref is None:
            findings.append(
                Finding(result.key, "no reference", True, None, result, detail="run --update-reference")
            )
            continue
        tolerance = math.hypot(ref.half_width, result.half_width)
        drop = ref.score - result.score
        status: Status
        detail = ""
        if drop > tolerance:
            status, detail = "regressed", f"score fell by {drop:.4f}, more than the tolerance {tolerance:.4f}"
        elif (result.null, result.full) != (ref.null, ref.full) and ref.null is not None:
            status = "pairing changed"
            detail = (
                f"paired with {result.null} and {result.full}; the reference with {ref.null} and {ref.full}"
            )
        elif result.identity != ref.identity:
            status = "spec changed"
            detail = (
                "the cell's resolved spec (model, task, protocol, parameters or runner version) is not the "
                "reference's: review the change, then run --update-reference"
            )
        elif result.outputs == ref.outputs:
            status = "same"
        elif result.code != ref.code:
            status = "changed with its code"
            detail = "the policy's source changed; its outputs did too, within the tolerance"
        elif environment_changes:
            status = "changed with the environment"
            detail = "the environment differs: " + ", ".join(environment_changes)
        else:
            status = "changed, code unchanged"
            detail = (
                "outputs differ although the cell's spec, the policy's source, the library versions and the "
                "machine did not change: the engine, runner or model code did; if intended, run "
                "--update-reference"
            )
        fails = status not in ("same", "changed with the environment", "changed with its code")
        findings.append(Finding(result.key, status, fails, ref, result, tolerance, detail))
    for key, ref in known.items():
        detail = "in the reference, not in this run of the suite: run --update-reference if intended"
        findings.append(Finding(key, "dropped", True, ref, None, detail=detail))
    return findings


def reference_path(root: Path, suite: str) -> Path:
    return root / f"{suite}.json"


class ReferenceManifest(Provenance):
    """What a reference was written from: the suite and its spec's hash, the command, where and when."""

    suite: str | None = None
    suite_sha256: str | None = None
    command: str | None = None
    written: str | None = None


def write_reference(path: Path, results: list[CellResult], manifest: ReferenceManifest) -> None:
    written = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    document = {
        "format_version": FORMAT_VERSION,
        "manifest": {**manifest.model_dump(mode="json", exclude_unset=True), "written": written},
        "cells": [asdict(r) for r in results],
    }
    text = json.dumps(document, indent=1, sort_keys=False) + "\n"
    atomic_write(path, lambda temp: temp.write_text(text))


def read_reference(path: Path) -> tuple[ReferenceManifest, list[CellResult]]:
    document = json.loads(path.read_text())
    if document.get("format_version") != FORMAT_VERSION:
        raise SpecError(
            f"{path}: reference format {document.get('format_version')!r}, this kvbench reads "
            f"{FORMAT_VERSION}: rewrite it with --update-reference"
        )
    manifest = ReferenceManifest.validated(document["manifest"], path)
    return manifest, [CellResult(**c) for c in document["cells"]]
