"""The rules a bundle must pass before `kvbench accept` writes anything: every one is checked, and each
failure names the member (or run) and the rule.

digest          each member's sha256 and size are the ones bundle.json lists, and nothing else is there
schema-version  the bundle's format and record schema are this kvbench's
identity        a run id is the hash of its resolved spec, which validates under this kvbench's specs
output-digest   each run's output digest, recomputed from its samples, is the one the bundle lists
sample-counts   one problem per shard, k samples each (k from the spec), no more problems than its limit
seeds           every sample's seed is the one the protocol derives for (task, problem, sample)
private-text    a private task's samples carry no text: no output, no grader detail
suite           the suite ships in the bundle with the hash its runs recorded, and is not a different
                file under the name of one of this kvbench's suites
protocol        the shipped protocol is the runs' protocol, and a built-in name means this kvbench's one
scorer          a policy not built into kvbench ships its source, with the hash its runs recorded
baselines       each policy run has its null and full-cache runs in the bundle, on the same problems
                and seeds
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pydantic
import yaml

from kvbench.core.seeding import sample_seed
from kvbench.registry import builtin_policies
from kvbench.results.records import SCHEMA_VERSION
from kvbench.runner.plan import RUNNER_VERSION
from kvbench.runner.store import problem_key
from kvbench.specs.loading import SPEC_ROOT
from kvbench.specs.model import ModelSpec
from kvbench.specs.protocol import ProtocolSpec, load_protocol, protocol_names
from kvbench.specs.suite import SuiteSpec, suite_names
from kvbench.specs.task import TaskSpec
from kvbench.submissions.bundle import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    BundleManifest,
    Failure,
    ResolvedShape,
    sha256_file,
)
from kvbench.submissions.contents import StoredRun, load_samples, output_digests, spec_identity, stored_runs
from kvbench.submissions.pairing import null_of, reference_of


@dataclass
class Checked:
    """A bundle after every rule: its manifest, runs and samples (in DuckDB), and what failed."""

    manifest: dict[str, Any]
    runs: list[StoredRun] = field(default_factory=list)
    samples: duckdb.DuckDBPyConnection | None = None
    failures: list[Failure] = field(default_factory=list)

    def fail(self, member: str, rule: str, message: str) -> None:
        self.failures.append(Failure(member, rule, message))


def check_bundle(folder: Path) -> Checked:
    """Every rule over an extracted bundle (kvbench.submissions.bundle.open_bundle)."""
    try:
        manifest = BundleManifest.model_validate_json((folder / MANIFEST).read_bytes()).model_dump()
    except (OSError, pydantic.ValidationError) as exc:
        checked = Checked({})
        checked.fail(MANIFEST, "bundle-manifest", f"missing or not a bundle manifest ({_first_line(exc)})")
        return checked
    checked = Checked(manifest)
    _digests(folder, checked)
    if (manifest.get("format"), manifest.get("format_version")) != (FORMAT, FORMAT_VERSION):
        checked.fail(
            MANIFEST,
            "schema-version",
            f"format {manifest.get('format')!r} "
            f"v{manifest.get('format_version')}, this kvbench reads {FORMAT} v{FORMAT_VERSION}",
        )
    if manifest.get("schema_version") != SCHEMA_VERSION:
        checked.fail(
            MANIFEST,
            "schema-version",
            f"records of schema {manifest.get('schema_version')}, this "
            f"kvbench stores schema {SCHEMA_VERSION}: export them with this kvbench version",
        )
    runs, broken = stored_runs(folder / "runs")
    for name in broken:
        checked.fail(f"runs/{name}/manifest.json", "bundle-manifest", "missing or not a run manifest")
    listed = {c["run_id"] for c in manifest["cells"]}
    for run in runs:
        if run.run_id not in listed:
            checked.fail(f"runs/{run.run_id}", "bundle-manifest", "a run the bundle manifest does not list")
    checked.runs = [r for r in runs if r.run_id in listed]
    missing = listed - {r.run_id for r in runs} - set(broken)
    for run_id in sorted(map(str, missing)):
        checked.fail(
            f"runs/{run_id}", "bundle-manifest", "listed in the bundle manifest but not in the bundle"
        )
    con, bad = load_samples(checked.runs)
    checked.samples = con
    for path, why in bad:
        checked.fail(str(path.relative_to(folder)), "sample-counts", why)
    cells = {c["run_id"]: c for c in manifest["cells"]}
    # a run whose spec does not even have the shape of one is judged no further
    checked.runs = [run for run in checked.runs if _run_rules(folder, run, cells[run.run_id], checked)]
    _baselines(checked)
    return checked


def _digests(folder: Path, checked: Checked) -> None:
    members = checked.manifest["members"]
    present = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} - {MANIFEST}
    for name in sorted(present - set(members)):
        checked.fail(name, "digest", "not listed in the bundle manifest's members")
    for name, entry in sorted(members.items()):
        if name not in present:
            checked.fail(name, "digest", "listed in the bundle manifest but missing")
        elif (folder / name).stat().st_size != entry.get("size") or sha256_file(folder / name) != entry.get(
            "sha256"
        ):
            checked.fail(name, "digest", "its sha256 or size is not the one the bundle manifest lists")


def _run_rules(folder: Path, run: StoredRun, cell: dict[str, Any], checked: Checked) -> bool:
    """The rules on one run; False when its spec is not one this kvbench can read."""
    where = f"runs/{run.run_id}"
    spec = run.spec
    if spec_identity(spec) != run.run_id or run.manifest.get("run_id") != run.run_id:
        checked.fail(
            f"{where}/manifest.json",
            "identity",
            f"the resolved spec hashes to {spec_identity(spec)}, not to its run id {run.run_id}",
        )
    if spec.get("runner_version") != RUNNER_VERSION:
        checked.fail(
            f"{where}/manifest.json",
            "identity",
            f"scored by runner version {spec.get('runner_version')}, this kvbench's is {RUNNER_VERSION}",
        )
    problem = _spec_problem(spec)
    if problem:
        checked.fail(f"{where}/manifest.json", "identity", f"the resolved spec is not valid here: {problem}")
        return False
    assert checked.samples is not None
    rows = checked.samples.execute(
        "SELECT problem_id, problem_hash, sample, seed, task, output, secondary FROM samples "
        "WHERE run_id = ? ORDER BY problem_id, sample",
        [run.run_id],
    ).fetchall()
    _counts(where, run, rows, checked)
    digest = output_digests(checked.samples, [run.run_id])[run.run_id]
    if digest != cell.get("output_digest"):
        checked.fail(
            where,
            "output-digest",
            f"its samples digest to {digest}, the bundle lists {cell.get('output_digest')}",
        )
    if spec["task"]["visibility"] != "public":
        texts = [r for r in rows if r[5] is not None or "detail" in json.loads(r[6] or "{}")]
        if texts:
            checked.fail(
                where,
                "private-text",
                f"task {spec['task']['name']} is private, yet {len(texts)} "
                "sample(s) carry output text or grader detail",
            )
    _suite(folder, run, cell, checked)
    _protocol(folder, run, cell, checked)
    _scorer(folder, run, cell, checked)
    return True


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _spec_problem(spec: dict[str, Any]) -> str | None:
    try:
        ResolvedShape.model_validate(spec)
        ModelSpec.model_validate(spec["model"])
        TaskSpec.model_validate(spec["task"])
        ProtocolSpec.model_validate({**spec["protocol"], "description": ""})
    except (KeyError, TypeError, pydantic.ValidationError) as exc:
        return _first_line(exc)
    return None


def _counts(where: str, run: StoredRun, rows: list[tuple], checked: Checked) -> None:
    spec = run.spec
    by_problem: dict[str, list[int]] = {}
    seeds_wrong = 0
    for problem, hashed, sample, seed, task, *_ in rows:
        by_problem.setdefault(problem, []).append(sample)
        if hashed != problem_key(problem) or task != spec["task"]["name"]:
            checked.fail(where, "sample-counts", f"problem {problem!r}: its hash or task is not its own")
        seeds_wrong += seed != sample_seed(spec["protocol"]["seed"], task, problem, sample)
    shards = {p.stem for p in run.shards}
    if shards != {problem_key(p) for p in by_problem}:
        checked.fail(
            where, "sample-counts", "its shards are not one per problem, named by the problem's hash"
        )
    for problem, samples in by_problem.items():
        if sorted(samples) != list(range(spec["samples"])):
            checked.fail(
                where,
                "sample-counts",
                f"problem {problem!r} has samples {sorted(samples)}, the spec asks for {spec['samples']}",
            )
    if not by_problem or (spec["limit"] is not None and len(by_problem) > spec["limit"]):
        checked.fail(
            where, "sample-counts", f"{len(by_problem)} problems, the spec's limit is {spec['limit']}"
        )
    if seeds_wrong:
        checked.fail(
            where,
            "seeds",
            f"{seeds_wrong} sample(s) carry a seed other than the protocol's "
            f"(seed {spec['protocol']['seed']}, task, problem, sample)",
        )


def _suite(folder: Path, run: StoredRun, cell: dict[str, Any], checked: Checked) -> None:
    member = str(cell.get("suite") or "")
    path = folder / member
    if not member.startswith("suites/") or not path.is_file():
        checked.fail(
            member or f"runs/{run.run_id}", "suite", "the suite the run was planned from is not shipped"
        )
        return
    text = path.read_bytes()
    recorded = _mapping(run.manifest.get("suite"))
    shipped = hashlib.sha256(text).hexdigest()
    if recorded.get("sha256") and recorded["sha256"] != shipped:
        checked.fail(member, "suite", f"sha256 {shipped[:16]}…, the run recorded {recorded['sha256'][:16]}…")
        return
    try:
        suite = SuiteSpec.model_validate(yaml.safe_load(text))
    except (yaml.YAMLError, pydantic.ValidationError) as exc:
        checked.fail(member, "suite", f"not a valid suite here ({str(exc).splitlines()[0]})")
        return
    if suite.name in suite_names():
        ours = (SPEC_ROOT / "suites" / f"{suite.name}.yaml").read_bytes()
        if hashlib.sha256(ours).digest() != hashlib.sha256(text).digest():
            checked.fail(
                member,
                "suite",
                f"differs from this kvbench's suite {suite.name!r} under the same "
                "name: rename a modified suite",
            )


def _protocol(folder: Path, run: StoredRun, cell: dict[str, Any], checked: Checked) -> None:
    member = str(cell.get("protocol") or "")
    resolved = run.spec["protocol"]
    try:
        shipped = ProtocolSpec.model_validate(yaml.safe_load((folder / member).read_text()))
    except (OSError, yaml.YAMLError, pydantic.ValidationError) as exc:
        checked.fail(member or f"runs/{run.run_id}", "protocol", f"not shipped or not valid ({exc})")
        return
    if shipped.model_dump(mode="json", exclude={"description"}) != resolved:
        checked.fail(member, "protocol", f"is not the protocol run {run.run_id} resolved")
    name = resolved["name"]
    if (
        name in protocol_names()
        and load_protocol(name).model_dump(mode="json", exclude={"description"}) != resolved
    ):
        checked.fail(member, "protocol", f"differs from this kvbench's protocol {name!r} under the same name")


def _scorer(folder: Path, run: StoredRun, cell: dict[str, Any], checked: Checked) -> None:
    name = run.spec["policy"]["name"]
    if name in builtin_policies():
        return
    member = cell.get("scorer")
    recorded = _mapping(run.manifest.get("policy_doc")).get("source_sha256")
    if not member or not (folder / member).is_file():
        checked.fail(
            f"runs/{run.run_id}", "scorer", f"policy {name!r} is not built in and its source is not shipped"
        )
    elif recorded is None or sha256_file(folder / member) != recorded:
        checked.fail(member, "scorer", f"its sha256 is not the one run {run.run_id} recorded for {name!r}")


def _baselines(checked: Checked) -> None:
    assert checked.samples is not None
    units = {
        run.run_id: set(
            checked.samples.execute(
                "SELECT problem_id, sample, seed FROM samples WHERE run_id = ?", [run.run_id]
            ).fetchall()
        )
        for run in checked.runs
    }
    for run in checked.runs:
        if run.role != "policy":
            continue
        for arm, partner in (
            ("null", null_of(run, checked.runs)),
            ("full cache", reference_of(run, checked.runs)),
        ):
            if partner is None:
                checked.fail(
                    f"runs/{run.run_id}", "baselines", f"no {arm} run of the same cell in the bundle"
                )
            elif units[partner.run_id] != units[run.run_id]:
                checked.fail(
                    f"runs/{run.run_id}",
                    "baselines",
                    f"its problems, samples or seeds differ from its {arm} run {partner.run_id}",
                )
