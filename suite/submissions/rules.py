"""The rules a bundle must pass before `kvbench accept` writes anything: every one is checked, and each
failure names the member (or run) and the rule.

digest          each member's sha256 and size are the ones bundle.json lists, and nothing else is there
schema-version  the bundle's format and record schema are this kvbench's
identity        a run id is the hash of its resolved spec, which is in the canonical form this kvbench
                resolves; its role fits its policy (the null is the protocol's baseline, the full
                cache its reference); a built-in task keeps this kvbench's visibility
output-digest   each run's output digest, recomputed from its samples, is the one the bundle lists
known-spec      the task and the model are this kvbench's, as it ships them (a task's max_new_tokens at most
                its own): a board re-computes runs, and a spec names what the operator's machine reads
sample-counts   one problem per shard, k samples each (k from the spec), as many problems as its limit
seeds           every sample's seed is the one the protocol derives for (task, problem, sample)
budget          K, N_avg and the ratio agree as `kvbench run` sets them (the ratio the number a board
                shows it as, at most 6 significant digits): N_avg is the one this kvbench
                gives the task and model (or, on a generation task, the mean generated length of the
                bundle's own full-cache run that the measurement names), K = N_avg/ratio as the budget
                rule rounds it, and K is above the buffer: a board groups and labels runs by them
value-range     every number a sample carries is finite, and a share is in [0, 1]: the task's metric
                when its kind is pass/fail or proportion (kvbench.specs.metric_kind), the needle's
                shares and the retention telemetry's
private-text    a private task's samples carry no text: no output, no grader detail, no long strings
suite           the suite ships in the bundle, as the member its run names, with the hash the run
                recorded, and is not a different file under the name of one of this kvbench's suites
protocol        the shipped protocol is the runs' protocol, and a built-in name means this kvbench's one
scorer          a policy not built into kvbench ships its source, with the hash its runs recorded
policy-name     every policy name a run carries (its spec's, its documentation's) is one @kvbench.policy
                accepts (kvbench.core.contract.POLICY_NAME)
baselines       each policy run has its null and full-cache runs in the bundle, on the same problems
                and seeds
readable        anything else that keeps a run from being judged (a file of an unexpected shape)
runs            the bundle lists at least one run
text            every string (the submitter, the description, labels, names, parameters, problem ids,
                outputs) is UTF-8 text of its field's class and within its length bound
                (kvbench.submissions.text): no lone surrogate, no control character in a one-line field

The members a run refers to (suite, protocol, scorer) are derived from the run, never taken as paths.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import duckdb
import pydantic
import yaml

from kvbench.core.contract import policy_name_problem
from kvbench.core.seeding import sample_seed
from kvbench.registry import builtin_policies
from kvbench.results.check import outputs_digest
from kvbench.results.pairing import partners
from kvbench.runner.identity import RUNNER_VERSION
from kvbench.specs.loading import find_spec_file
from kvbench.specs.metric_kind import METRIC_KINDS, MetricKind, task_metric
from kvbench.specs.model import load_model_spec, model_names
from kvbench.specs.protocol import BudgetRule, ProtocolSpec, load_protocol, protocol_names
from kvbench.specs.resolved import MeasurementRecord, ResolvedSpec, Role
from kvbench.specs.suite import SuiteSpec, suite_names
from kvbench.specs.task import load_task, task_names
from kvbench.store.records import FLOATS, SCHEMA_VERSION, SampleRecord, column
from kvbench.store.shards import problem_key
from kvbench.submissions.bundle import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    MEMBER_NAMES,
    BundleCell,
    BundleManifest,
    Failure,
    sha256_file,
)
from kvbench.submissions.contents import StoredRun, load_samples, stored_runs
from kvbench.submissions.presses import is_press
from kvbench.submissions.text import (
    SAMPLE_FIELDS,
    bundle_field,
    json_problems,
    manifest_field,
    text_problem,
)


@dataclass
class Checked:
    """A bundle after every rule: its manifest, runs and samples (in DuckDB), and what failed."""

    manifest: BundleManifest | None
    """None where bundle.json does not read as one (or a kept bundle, read without its rules)."""
    runs: list[StoredRun] = field(default_factory=list)
    samples: duckdb.DuckDBPyConnection | None = None
    failures: list[Failure] = field(default_factory=list)

    def fail(self, member: str, rule: str, message: str) -> None:
        self.failures.append(Failure(member, rule, message))


def check_bundle(folder: Path) -> Checked:
    """Every rule over an extracted bundle (kvbench.submissions.bundle.open_bundle)."""
    try:
        manifest = BundleManifest.model_validate_json((folder / MANIFEST).read_bytes())
    except (OSError, pydantic.ValidationError) as exc:
        checked = Checked(None)
        checked.fail(MANIFEST, "bundle-manifest", f"missing or not a bundle manifest ({_first_line(exc)})")
        return checked
    checked = Checked(manifest)
    _digests(folder, checked)
    _some_runs(checked)
    if (manifest.format, manifest.format_version) != (FORMAT, FORMAT_VERSION):
        checked.fail(
            MANIFEST,
            "schema-version",
            f"format {manifest.format!r} "
            f"v{manifest.format_version}, this kvbench reads {FORMAT} v{FORMAT_VERSION}",
        )
    if manifest.schema_version != SCHEMA_VERSION:
        checked.fail(
            MANIFEST,
            "schema-version",
            f"records of schema {manifest.schema_version}, this "
            f"kvbench stores schema {SCHEMA_VERSION}: export them with this kvbench version",
        )
    runs, broken = stored_runs(folder / "runs")
    for name, why in broken.items():
        checked.fail(f"runs/{name}/manifest.json", "bundle-manifest", f"missing or not a run manifest: {why}")
    cells = {c.run_id: c for c in manifest.cells}
    for run in runs:
        if run.run_id not in cells:
            checked.fail(f"runs/{run.run_id}", "bundle-manifest", "a run the bundle manifest does not list")
    checked.runs = [r for r in runs if r.run_id in cells]
    missing = cells.keys() - {r.run_id for r in runs} - set(broken)
    for run_id in sorted(map(str, missing)):
        checked.fail(
            f"runs/{run_id}", "bundle-manifest", "listed in the bundle manifest but not in the bundle"
        )
    con, bad = load_samples(checked.runs)
    checked.samples = con
    for path, rule, why in bad:
        checked.fail(str(path.relative_to(folder)), rule, why)
    _text(folder, checked)
    # a run whose spec does not even have the shape of one is judged no further
    checked.runs = [run for run in checked.runs if _run_rules(folder, run, cells[run.run_id], checked)]
    _baselines(checked)
    return checked


def _some_runs(checked: Checked) -> None:
    assert checked.manifest is not None
    if not checked.manifest.cells:
        checked.fail(MANIFEST, "runs", "lists no runs: export at least one run (`kvbench export --run ...`)")


_TEXT_FAILURES = 20
"""The most malformed strings named per member: a forged shard may hold thousands."""


def _text(folder: Path, checked: Checked) -> None:
    """The text rule over bundle.json, every run's manifest (read again as plain JSON: a string's class
    follows where it is) and every sample's string columns."""
    files = [(MANIFEST, bundle_field)]
    files += [(f"runs/{run.run_id}/manifest.json", manifest_field) for run in checked.runs]
    for member, classify in files:
        try:
            found = json_problems(json.loads((folder / member).read_bytes()), classify)
        except (OSError, ValueError, RecursionError):
            continue  # the bundle-manifest rule names a file that does not read
        for where, problem in list(found)[:_TEXT_FAILURES]:
            checked.fail(member, "text", f"{where} {problem}")
    assert checked.samples is not None
    columns = ", ".join(SAMPLE_FIELDS)
    for run in checked.runs:
        failures = 0
        rows = checked.samples.execute(
            f"SELECT problem_id, sample, {columns} FROM samples WHERE run_id = ?", [run.run_id]
        )
        while failures < _TEXT_FAILURES and (row := rows.fetchone()) is not None:
            problem_id, sample, *values = row
            for (name, kind), value in zip(SAMPLE_FIELDS.items(), values, strict=True):
                wrong = text_problem(value, kind) if isinstance(value, str) else None
                if wrong and failures < _TEXT_FAILURES:
                    failures += 1
                    # the problem id, short, where it is not itself what is wrong
                    where = name if name == "problem_id" else f"{name} of problem {problem_id[:64]!r}"
                    checked.fail(f"runs/{run.run_id}", "text", f"{where} (sample {sample}) {wrong}")


def _digests(folder: Path, checked: Checked) -> None:
    assert checked.manifest is not None
    members = checked.manifest.members
    present = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} - {MANIFEST}
    for name in sorted(present - set(members)):
        checked.fail(name, "digest", "not listed in the bundle manifest's members")
    for name, entry in sorted(members.items()):
        if name not in present:
            checked.fail(name, "digest", "listed in the bundle manifest but missing")
        elif (folder / name).stat().st_size != entry.size or sha256_file(folder / name) != entry.sha256:
            checked.fail(name, "digest", "its sha256 or size is not the one the bundle manifest lists")


def _run_rules(folder: Path, run: StoredRun, cell: BundleCell, checked: Checked) -> bool:
    """The rules on one run; False when its spec or role is not one this kvbench can judge further."""
    where = f"runs/{run.run_id}"
    try:
        hashed = run.spec.identity
        if hashed != run.run_id or run.manifest.run_id != run.run_id:
            checked.fail(
                f"{where}/manifest.json",
                "identity",
                f"the resolved spec hashes to {hashed}, not to its run id {run.run_id}",
            )
        problem = _spec_problem(run, cell)
        if problem:
            checked.fail(f"{where}/manifest.json", "identity", f"not a run this kvbench can judge: {problem}")
            return False
        assert checked.samples is not None
        rows = checked.samples.execute(
            "SELECT problem_id, problem_hash, sample, seed, task, output, secondary, finish_reason, reason, "
            "grader_version FROM samples WHERE run_id = ? ORDER BY problem_id, sample",
            [run.run_id],
        ).fetchall()
        _counts(where, run, rows, checked)
        if len(rows) != cell.samples:
            checked.fail(where, "sample-counts", f"{len(rows)} samples, the bundle lists {cell.samples}")
        outputs = outputs_digest(checked.samples, run.run_id)
        if outputs != cell.output_digest:
            checked.fail(
                where,
                "output-digest",
                f"its samples digest to {outputs}, the bundle lists {cell.output_digest}",
            )
        _known_specs(f"{where}/manifest.json", run, checked)
        _private(where, run.spec, rows, checked)
        _value_ranges(where, run, checked)
        _budget(f"{where}/manifest.json", run, checked)
        _suite(folder, run, cell, checked)
        _protocol(folder, run, cell, checked)
        _scorer(folder, run, cell, checked)
        _policy_names(where, run, checked)
        return True
    except Exception as exc:  # a submitter's file of any shape: refused by name, never a traceback
        checked.fail(where, "readable", f"cannot be judged ({type(exc).__name__}: {_first_line(exc)})")
        return False


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _spec_problem(run: StoredRun, cell: BundleCell) -> str | None:
    """What makes a run's spec or role one this kvbench cannot judge, or None. The spec (typed when its
    manifest was read) must be in the canonical form this kvbench writes (so no field the rules read can
    be missing), and the role must fit the policy: the null is the protocol's baseline, the full cache its
    reference."""
    spec = run.spec
    record = spec.record()
    canonical = {
        "model": spec.model.model_dump(mode="json"),
        "task": spec.task.model_dump(mode="json"),
        "protocol": spec.protocol.identity(),
    }
    for name, form in canonical.items():
        if record[name] != form:
            return f"its {name} is not in the form this kvbench resolves (fields missing or added)"
    if spec.runtime is None or spec.runtime.dtype is None:
        return "it does not record the runtime it ran on"
    if spec.runner_version != RUNNER_VERSION:
        return f"scored by runner version {spec.runner_version}, this kvbench's is {RUNNER_VERSION}"
    role, policy = run.role, spec.policy.name
    arm = {Role.NULL: spec.protocol.baseline, Role.REFERENCE: spec.protocol.reference}
    # a policy under test may be any policy (even the baseline's); the null and the full cache may not
    if role != cell.role or (role in arm and policy != arm[role]):
        return f"role {str(role)!r} (bundle: {str(cell.role)!r}) for policy {policy!r}"
    budget = spec.budget if spec.task.scored_from_first_eviction else None
    if role == Role.REFERENCE and (spec.budget, spec.ratio) != (budget, None):
        return "a full-cache run with a budget its scores do not depend on"
    task = spec.task.name
    if task in task_names() and load_task(task).visibility != spec.task.visibility:
        return f"task {task!r} is {load_task(task).visibility} in this kvbench, not {spec.task.visibility}"
    return None


OVERRIDABLE_TASK_FIELDS = {"max_new_tokens"}
"""What `kvbench run` may change in a task it ships (``--max-new-tokens``, at most the task's own)."""


def _known_specs(where: str, run: StoredRun, checked: Checked) -> None:
    """A board re-computes only the tasks and models this kvbench ships, as it ships them: a task or model
    spec names files and repositories to read, and a bundle's would make the operator's machine read
    whatever it names (and publish it as problems)."""
    spec = run.spec
    theirs, names = spec.task.model_dump(mode="json"), task_names()
    if spec.task.name not in names:
        checked.fail(where, "known-spec", f"task {spec.task.name!r} is not one of this kvbench's tasks")
    else:
        ours = load_task(spec.task.name).model_dump(mode="json")
        differs = sorted(
            k for k in {*ours, *theirs} - OVERRIDABLE_TASK_FIELDS if ours.get(k) != theirs.get(k)
        )
        longer = (theirs.get("max_new_tokens") or 0) > (ours.get("max_new_tokens") or 0)
        if differs or longer:
            what = ", ".join(differs + (["max_new_tokens above this kvbench's"] if longer else []))
            checked.fail(
                where, "known-spec", f"task {spec.task.name!r} is not this kvbench's (differs in: {what})"
            )
    if spec.model.name not in model_names():
        checked.fail(where, "known-spec", f"model {spec.model.name!r} is not one of this kvbench's models")
    elif load_model_spec(spec.model.name).model_dump(mode="json") != spec.model.model_dump(mode="json"):
        checked.fail(
            where, "known-spec", f"model {spec.model.name!r} is not this kvbench's (its source differs)"
        )


def _counts(where: str, run: StoredRun, rows: list[tuple], checked: Checked) -> None:
    spec = run.spec
    by_problem: dict[str, list[int]] = {}
    seeds_wrong = 0
    misnamed = 0
    for problem, hashed, sample, seed, task, *_ in rows:
        by_problem.setdefault(problem, []).append(sample)
        misnamed += hashed != problem_key(problem) or task != spec.task.name
        seeds_wrong += seed != sample_seed(spec.protocol.seed, task, problem, sample)
    if misnamed:
        checked.fail(where, "sample-counts", f"{misnamed} sample(s) carry another problem's hash or task")
    shards = {p.stem for p in run.shards}
    if shards != {problem_key(p) for p in by_problem}:
        checked.fail(
            where, "sample-counts", "its shards are not one per problem, named by the problem's hash"
        )
    for problem, samples in by_problem.items():
        if sorted(samples) != list(range(spec.samples)):
            checked.fail(
                where,
                "sample-counts",
                f"problem {problem!r} has samples {sorted(samples)}, the spec asks for {spec.samples}",
            )
    if not by_problem or len(by_problem) != spec.limit:
        # the board computes every problem the spec names: a submitted run states how many, and holds them
        checked.fail(
            where,
            "sample-counts",
            f"{len(by_problem)} problems, the spec's limit is {spec.limit}: a run holds every problem its "
            "spec names, and states how many (run with --limit N, N the problems it scores)",
        )
    if seeds_wrong:
        checked.fail(
            where,
            "seeds",
            f"{seeds_wrong} sample(s) carry a seed other than the protocol's "
            f"(seed {spec.protocol.seed}, task, problem, sample)",
        )


PRIVATE_FINISH = {"stop", "length", "teacher-forced"}
PRIVATE_TEXT_LIMIT = 100
"""The longest grader category or version string a private task's sample may carry."""


def _private(where: str, spec: ResolvedSpec, rows: list[tuple], checked: Checked) -> None:
    if spec.task.visibility == "public":
        return
    texts = 0
    for *_, output, secondary, finish, reason, version in rows:
        try:
            extra = json.loads(secondary or "{}")
        except (ValueError, RecursionError):  # not JSON a grader writes: it cannot be a private row's
            extra = None
        texts += (
            output is not None
            or not isinstance(extra, dict)
            or "detail" in extra
            or finish not in PRIVATE_FINISH
            or any(
                isinstance(v, str) and len(v) > PRIVATE_TEXT_LIMIT for v in (reason, version, *extra.values())
            )
        )
    if texts:
        checked.fail(
            where,
            "private-text",
            f"task {spec.task.name} is private, yet {texts} sample(s) "
            "carry output text, grader detail or long strings",
        )


SHARES = (
    *(
        name
        for name, kind in METRIC_KINDS.items()
        if kind != MetricKind.UNBOUNDED and name in SampleRecord.model_fields
    ),
    "needle_high_precision",
    *(name for name in SampleRecord.model_fields if column(SampleRecord, name) is FLOATS),
)
"""The samples columns that are shares, in [0, 1] (besides the task's own metric, by its kind)."""


def _value_ranges(where: str, run: StoredRun, checked: Checked) -> None:
    """Every float a run's samples carry is finite, and each share is in [0, 1]: a proportion of 1.7 or
    a NaN would pass through every mean and sign test downstream as a score."""
    assert checked.samples is not None
    shares = {*SHARES, *(("metric",) if task_metric(run.spec.task).kind != MetricKind.UNBOUNDED else ())}
    floats = [n for n in SampleRecord.model_fields if column(SampleRecord, n).sql in ("DOUBLE", "FLOAT[]")]

    def outside(name: str, value: str) -> str:
        return f"NOT isfinite({value})" + (f" OR {value} < 0 OR {value} > 1" if name in shares else "")

    tests = [
        f"count(*) FILTER (WHERE len(list_filter({n}, lambda x: {outside(n, 'x')})) > 0)"
        if column(SampleRecord, n) is FLOATS
        else f"count(*) FILTER (WHERE {outside(n, n)})"
        for n in floats
    ]
    counts = checked.samples.execute(
        f"SELECT {', '.join(tests)} FROM samples WHERE run_id = ?", [run.run_id]
    ).fetchone()
    for name, count in zip(floats, counts or (), strict=False):
        if count:
            bound = "finite and in [0, 1] (a share)" if name in shares else "finite"
            checked.fail(where, "value-range", f"{count} sample(s) carry a {name} that is not {bound}")


def _budget(where: str, run: StoredRun, checked: Checked) -> None:
    """K, N_avg and the ratio as `kvbench run` sets them (kvbench.runner.plan, kvbench.runner.budgets): a
    run that claims another N_avg or ratio for its K would be listed in another compression's table."""
    spec = run.spec
    if spec.task.name not in task_names():
        return  # known-spec refuses it
    declared = load_task(spec.task.name).reference_n_avg(spec.model.name)
    measurement = spec.n_avg_measurement
    expected: float | None = declared
    if measurement is not None:
        problem = _measurement_problem(spec, measurement, declared, checked)
        if problem:
            checked.fail(where, "budget", problem)
            return
        expected = measurement.measured
    if not _same_n_avg(spec.n_avg, expected):
        checked.fail(
            where, "budget", f"N_avg {spec.n_avg} is not the one this kvbench gives {spec.task.name!r} on "
            f"{spec.model.name!r} ({expected})"
        )  # fmt: skip
        return
    if spec.ratio is not None:
        if float(f"{spec.ratio:g}") != spec.ratio:  # a board labels and links a compression by this
            checked.fail(
                where, "budget", f"ratio {spec.ratio!r} is shown as {spec.ratio:g}x on a board, the label of "
                "another ratio: a ratio must be the number it is shown as"
            )  # fmt: skip
            return
        if spec.n_avg is None or not math.isfinite(spec.n_avg):
            checked.fail(where, "budget", f"K = N_avg/{spec.ratio:g} with no N_avg")
            return
        wanted = BudgetRule(ratio=spec.ratio).budget(spec.n_avg, spec.protocol.buffer)
        if spec.budget != wanted:
            checked.fail(
                where, "budget", f"K = {spec.budget}, where N_avg {spec.n_avg:g} and ratio {spec.ratio:g} "
                f"give K = {wanted}"
            )  # fmt: skip
            return
    if spec.budget is not None and spec.budget <= spec.protocol.buffer and run.role != Role.REFERENCE:
        checked.fail(where, "budget", f"K = {spec.budget} is not above the buffer ({spec.protocol.buffer})")


def _same_n_avg(claimed: float | None, expected: float | None) -> bool:
    def missing(value: float | None) -> bool:
        return value is None or math.isnan(value)

    if missing(claimed) or missing(expected):
        return missing(claimed) and missing(expected)
    assert claimed is not None and expected is not None
    return math.isclose(claimed, expected, rel_tol=1e-12, abs_tol=1e-9)


def _measurement_problem(
    spec: ResolvedSpec, measurement: MeasurementRecord, declared: float | None, checked: Checked
) -> str | None:
    """Why a measured N_avg is not the mean generated length of the bundle's full-cache run it names."""
    if not _same_n_avg(measurement.declared, declared):
        return f"its measurement declares N_avg {measurement.declared}, this kvbench's task {declared}"
    assert checked.samples is not None
    reference = next((r for r in checked.runs if r.run_id == measurement.reference_run), None)
    if reference is None or reference.role != Role.REFERENCE or reference.spec.task != spec.task:
        return f"its N_avg was measured on {measurement.reference_run}, not a full-cache run of the bundle"
    problems, samples, mean, shortest, longest = checked.samples.execute(
        "SELECT count(DISTINCT problem_id), count(*), avg(generated_tokens), min(generated_tokens), "
        "max(generated_tokens) FROM samples WHERE run_id = ?",
        [measurement.reference_run],
    ).fetchone() or (0, 0, None, None, None)
    if measurement.problems > problems or measurement.samples > samples:
        return f"its measurement names {measurement.samples} samples, the full-cache run holds {samples}"
    # measured on every problem the full run holds: its mean; on the first ones, before a larger --limit
    # extended the run (their order is the task's, which the bundle does not carry): within its lengths
    if measurement.problems == problems and not _same_n_avg(measurement.measured, mean):
        return f"its N_avg {measurement.measured:g} is not the full-cache run's mean length {mean:g}"
    if not shortest <= measurement.measured <= longest:
        return f"its N_avg {measurement.measured:g} is outside the full run's lengths ({shortest}-{longest})"
    return None


def _shipped(
    folder: Path, cell: BundleCell, field: str, named: str | None, expected: str, checked: Checked
) -> Path | None:
    """The member a cell names (``named``, in ``field``), which must be ``expected`` (derived from the run,
    never a path the submitter chose) and a member the bundle lists; None, with the failure, otherwise."""
    assert checked.manifest is not None
    if named != expected or not MEMBER_NAMES.fullmatch(expected) or expected not in checked.manifest.members:
        checked.fail(f"runs/{cell.run_id}", field, f"names {named!r}; the bundle must ship {expected!r}")
        return None
    path = folder / expected
    return path if path.is_file() else None


def _suite(folder: Path, run: StoredRun, cell: BundleCell, checked: Checked) -> None:
    recorded = run.manifest.suite
    name = recorded.name if recorded else PurePosixPath(cell.suite).stem
    path = _shipped(folder, cell, "suite", cell.suite, f"suites/{name}.yaml", checked)
    if path is None:
        return
    member, text = cell.suite, path.read_bytes()
    shipped = hashlib.sha256(text).hexdigest()
    if not recorded and name not in suite_names():
        checked.fail(member, "suite", "the run records no suite, and this one is not one of this kvbench's")
        return
    if recorded and recorded.sha256 != shipped:
        checked.fail(member, "suite", f"sha256 {shipped[:16]}…, the run recorded {recorded.sha256[:16]}…")
        return
    try:
        suite = SuiteSpec.model_validate(_bundle_yaml(text))
    except (yaml.YAMLError, pydantic.ValidationError) as exc:
        checked.fail(member, "suite", f"not a valid suite here ({_first_line(exc)})")
        return
    if suite.name != name:
        checked.fail(member, "suite", f"names itself {suite.name!r}, shipped as {name!r}")
    elif name in suite_names() and find_spec_file("suite", "suites", name).read_bytes() != text:
        checked.fail(
            member,
            "suite",
            f"differs from this kvbench's suite {name!r} under the same name: rename a modified suite",
        )


class _WithoutAliases(yaml.SafeLoader):
    """YAML's safe loader, refusing every alias: nested aliases expand to far more than the text (a
    29 kB "billion laughs" protocol held a list that took minutes and GBs to print in a message), and
    kvbench's own suites and protocols use none."""

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"an alias (*{event.anchor}), which a bundle's YAML may not use", event.start_mark
            )
        return super().compose_node(parent, index)


def _bundle_yaml(text: str | bytes) -> object:
    return yaml.load(text, Loader=_WithoutAliases)  # a SafeLoader subclass: safe tags only


def _protocol(folder: Path, run: StoredRun, cell: BundleCell, checked: Checked) -> None:
    resolved = run.spec.protocol.identity()  # the record's, as the identity rule checked
    name = run.spec.protocol.name
    path = _shipped(folder, cell, "protocol", cell.protocol, f"protocols/{name}.yaml", checked)
    if path is None:
        return
    member = cell.protocol
    try:
        shipped = ProtocolSpec.model_validate(_bundle_yaml(path.read_text()))
    except (UnicodeDecodeError, yaml.YAMLError, pydantic.ValidationError) as exc:
        checked.fail(member, "protocol", f"not a valid protocol ({_first_line(exc)})")
        return
    if shipped.identity() != resolved:
        checked.fail(member, "protocol", f"is not the protocol run {run.run_id} resolved")
    if name in protocol_names() and load_protocol(name).identity() != resolved:
        checked.fail(member, "protocol", f"differs from this kvbench's protocol {name!r} under the same name")


def _scorer(folder: Path, run: StoredRun, cell: BundleCell, checked: Checked) -> None:
    name, doc = run.spec.policy.name, run.manifest.policy_doc
    if name in builtin_policies() or is_press(name, doc):
        if cell.scorer is not None:
            kind = "built-in policy" if name in builtin_policies() else "kvpress press"
            checked.fail(f"runs/{run.run_id}", "scorer", f"ships a scorer for the {kind} {name!r}")
        elif name not in builtin_policies() and "kvpress_version" not in run.spec.policy.params:
            why = f"the kvpress press {name!r} records no kvpress version"
            checked.fail(f"runs/{run.run_id}", "scorer", why)
        return
    recorded = doc.source_sha256 if doc is not None else None
    path = _shipped(folder, cell, "scorer", cell.scorer, f"scorers/{name}.py", checked)
    if path is not None and (recorded is None or sha256_file(path) != recorded):
        checked.fail(
            str(cell.scorer), "scorer", f"its sha256 is not the one run {run.run_id} recorded for {name!r}"
        )


def _policy_names(where: str, run: StoredRun, checked: Checked) -> None:
    doc = run.manifest.policy_doc
    documented = doc.name if doc is not None and doc.name is not None else run.spec.policy.name
    for name in dict.fromkeys((run.spec.policy.name, documented)):
        problem = policy_name_problem(name)
        if problem:
            checked.fail(f"{where}/manifest.json", "policy-name", problem)


def _baselines(checked: Checked) -> None:
    assert checked.samples is not None
    units: dict[str, set[tuple]] = {}  # run id -> its (problem, sample, seed)
    for run_id, *unit in checked.samples.execute(
        "SELECT run_id, problem_id, sample, seed FROM samples"
    ).fetchall():
        units.setdefault(run_id, set()).add(tuple(unit))
    for run in checked.runs:
        if run.role != Role.POLICY:
            continue
        for arm, partner in partners(run.spec, checked.runs).items():
            if partner is None:
                checked.fail(
                    f"runs/{run.run_id}", "baselines", f"no {arm} run of the same cell in the bundle"
                )
            elif units.get(partner.run_id) != units.get(run.run_id):
                checked.fail(
                    f"runs/{run.run_id}",
                    "baselines",
                    f"its problems, samples or seeds differ from its {arm} run {partner.run_id}",
                )
