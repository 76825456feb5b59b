"""`kvbench export`: chosen runs of a results folder, with the null and full-cache runs they are judged
against, packed into one bundle (kvbench.submissions.bundle) that `kvbench accept` can check."""

from __future__ import annotations

import inspect
import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import distributions
from pathlib import Path
from typing import Any

import duckdb
import yaml

import kvbench
from kvbench.errors import KvbenchError, PrerequisiteError, SpecError
from kvbench.registry import builtin_policies, find_policy
from kvbench.results.check import outputs_digest
from kvbench.results.pairing import partners
from kvbench.specs.loading import find_spec_file
from kvbench.specs.protocol import load_protocol, protocol_names
from kvbench.specs.resolved import Role
from kvbench.store.records import SCHEMA_VERSION
from kvbench.submissions.bundle import (
    ENVIRONMENT,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    NAME,
    BundleCell,
    BundleManifest,
    Member,
    sha256_file,
    write_bundle,
)
from kvbench.submissions.contents import StoredRun, load_samples, stored_runs
from kvbench.submissions.presses import is_press


@dataclass(frozen=True)
class Exported:
    path: Path
    sha256: str
    size: int
    runs: int
    samples: int


def select(runs: list[StoredRun], run_ids: Sequence[str], policies: Sequence[str]) -> list[StoredRun]:
    """The runs asked for (by run id or id prefix, or by policy name; everything when neither), with the
    null and full-cache runs each policy run needs; an id or a policy that matches nothing is an error."""
    chosen: dict[str, StoredRun] = {}
    for wanted in run_ids:
        found = [r for r in runs if r.run_id.startswith(wanted)]
        if len(found) != 1:
            raise SpecError(f"--run {wanted!r} matches {len(found)} runs; give a longer prefix of a run id")
        chosen[found[0].run_id] = found[0]
    for name in policies:
        found = [r for r in runs if r.role == Role.POLICY and r.spec.policy.name == name]
        if not found:
            known = sorted({r.spec.policy.name for r in runs if r.role == Role.POLICY})
            raise SpecError(f"--policy {name!r} has no runs here; policies with runs: {', '.join(known)}")
        chosen |= {r.run_id: r for r in found}
    if not run_ids and not policies:
        chosen = {r.run_id: r for r in runs}
    for run in [r for r in chosen.values() if r.role == Role.POLICY]:
        for arm, partner in partners(run.spec, runs).items():
            if partner is None:
                raise PrerequisiteError(
                    f"run {run.run_id} ({run.manifest.label}) has no {arm} run beside it: run "
                    "the same `kvbench run` without --no-baselines, then export again"
                )
            chosen[partner.run_id] = partner
    return sorted(chosen.values(), key=lambda r: r.run_id)


def _scorer_sources(runs: list[StoredRun], given: Sequence[Path]) -> dict[str, Path]:
    """Policy name -> source file for every policy that is not built into kvbench: a file given with
    --scorer, or an installed entry point; its sha256 must be the one its runs recorded."""
    builtins = builtin_policies()
    sources: dict[str, Path] = {}
    by_hash = {sha256_file(path): path for path in given}
    for run in runs:
        name = run.spec.policy.name
        doc = run.manifest.policy_doc
        if name in builtins or name in sources or is_press(name, doc):
            continue
        recorded = doc.source_sha256 if doc is not None else None
        if recorded is None:
            raise PrerequisiteError(
                f"run {run.run_id} ({name}) predates scorer hashing: run it again with this kvbench into a "
                "fresh --out folder to export it"
            )
        path = by_hash.get(recorded)
        if path is None:
            try:
                path = Path(inspect.getfile(find_policy(name).cls))
            except KvbenchError:  # not installed here: the --scorer file is the only way
                path = None
        if path is None or sha256_file(path) != recorded:
            raise SpecError(
                f"policy {name!r} is not built into kvbench: give its source with --scorer FILE, the file "
                f"whose sha256 is {recorded} (the one its runs recorded)"
            )
        sources[name] = path
    return sources


def _environment(runs: list[StoredRun]) -> dict[str, Any]:
    def distinct(values: list[Any]) -> list[Any]:  # in first-seen order; the values are dicts, so not a set
        return [value for i, value in enumerate(values) if value not in values[:i]]

    runtimes = [r.spec.record().get("runtime") for r in runs]
    return {
        "hardware": distinct([run.manifest.hardware for run in runs]),
        "packages": distinct([run.manifest.packages for run in runs]),
        "runtimes": sorted({json.dumps(runtime, sort_keys=True) for runtime in runtimes}),
        "exported_with": {
            "kvbench": kvbench.__version__,
            "distributions": sorted(f"{d.metadata['Name']}=={d.version}" for d in distributions()),
        },
    }


def _suite_text(run: StoredRun, fallback: str | None) -> tuple[str, str]:
    recorded = run.manifest.suite
    if recorded:
        return recorded.name, recorded.yaml
    if fallback is None:
        raise SpecError(
            f"run {run.run_id} does not record its suite (it predates suite recording): name it with "
            "--suite NAME_OR_FILE"
        )
    path = find_spec_file("suite", "suites", fallback)
    return yaml.safe_load(path.read_text())["name"], path.read_text(encoding="utf-8")


def _protocol_text(run: StoredRun) -> str:
    name = run.spec.protocol.name
    description = load_protocol(name).description if name in protocol_names() else "as resolved in the runs"
    return yaml.safe_dump({**run.spec.protocol.identity(), "description": description}, sort_keys=False)


def _check_name(kind: str, name: str) -> None:
    if not NAME.fullmatch(name):
        raise SpecError(
            f"{kind} name {name!r} cannot name a bundle member: use letters, digits, '.', '_', '-'"
        )


def _member(staging: Path, members: dict[str, Path], folder: str, name: str, text: str) -> str:
    """``text`` written as the member ``folder/name.yaml``; two runs may share it only with one text."""
    _check_name(folder[:-1], name)
    member = f"{folder}/{name}.yaml"
    path = staging / member
    if member in members and path.read_text(encoding="utf-8") != text:
        raise PrerequisiteError(f"two runs name different {folder} {name!r}: export them in separate bundles")
    path.parent.mkdir(exist_ok=True)
    path.write_text(text, encoding="utf-8")
    members[member] = path
    return member


def _pack_run(
    run: StoredRun,
    staging: Path,
    members: dict[str, Path],
    suite: str | None,
    sources: Mapping[str, Path],
    con: duckdb.DuckDBPyConnection,
    samples: int,
) -> BundleCell:
    """Adds one run's manifest, shards, suite, protocol and scorer to ``members``; its bundle.json entry."""
    members[f"runs/{run.run_id}/manifest.json"] = run.folder / "manifest.json"
    members |= {f"runs/{run.run_id}/{shard.name}": shard for shard in run.shards}
    suite_member = _member(staging, members, "suites", *_suite_text(run, suite))
    protocol_member = _member(staging, members, "protocols", run.spec.protocol.name, _protocol_text(run))
    policy = run.spec.policy.name
    scorer_member = f"scorers/{policy}.py" if policy in sources else None
    if scorer_member:
        _check_name("policy", policy)
        members[scorer_member] = sources[policy]
    return BundleCell(
        run_id=run.run_id,
        role=run.role,
        label=run.manifest.label,
        output_digest=outputs_digest(con, run.run_id),
        samples=samples,
        suite=suite_member,
        protocol=protocol_member,
        scorer=scorer_member,
    )


def export(
    root: Path,
    destination: Path,
    *,
    run_ids: Sequence[str] = (),
    policies: Sequence[str] = (),
    scorers: Sequence[Path] = (),
    suite: str | None = None,
    submitter: str = "",
    description: str = "",
) -> Exported:
    """Pack the chosen runs under ``root/shards`` (and their baselines) into ``destination``."""
    runs, broken = stored_runs(root / "shards")
    if broken:
        raise PrerequisiteError(
            f"runs under {root / 'shards'} without a readable manifest: "
            + "; ".join(f"{name} ({why})" for name, why in broken.items())
        )
    if not runs:
        raise PrerequisiteError(f"no runs under {root / 'shards'}: run `kvbench run --out {root}` first")
    chosen = select(runs, run_ids, policies)
    con, bad = load_samples(chosen)
    if bad:
        raise PrerequisiteError(
            "damaged shards, export nothing:\n  " + "\n  ".join(f"{p}: {w}" for p, _, w in bad)
        )
    counts = dict(con.execute("SELECT run_id, count(*) FROM samples GROUP BY run_id").fetchall())
    sources = _scorer_sources(chosen, scorers)
    with tempfile.TemporaryDirectory() as staging_name:
        staging = Path(staging_name)
        members: dict[str, Path] = {}
        cells = []
        for run in chosen:
            if not counts.get(run.run_id):
                raise PrerequisiteError(f"run {run.run_id} ({run.manifest.label}) has no samples yet")
            cells.append(_pack_run(run, staging, members, suite, sources, con, counts[run.run_id]))
        (staging / ENVIRONMENT).write_text(json.dumps(_environment(chosen), indent=1, default=str))
        members[ENVIRONMENT] = staging / ENVIRONMENT
        manifest = BundleManifest(
            format=FORMAT,
            format_version=FORMAT_VERSION,
            schema_version=SCHEMA_VERSION,
            kvbench=kvbench.__version__,
            created=time.time(),
            submitter=submitter,
            description=description,
            cells=cells,
            members={
                name: Member(sha256=sha256_file(path), size=path.stat().st_size)
                for name, path in sorted(members.items())
            },
        )
        (staging / MANIFEST).write_text(json.dumps(manifest.model_dump(mode="json"), indent=1))
        members[MANIFEST] = staging / MANIFEST
        destination.parent.mkdir(parents=True, exist_ok=True)
        write_bundle(destination, members)
    return Exported(
        destination, sha256_file(destination), destination.stat().st_size, len(chosen), sum(counts.values())
    )
