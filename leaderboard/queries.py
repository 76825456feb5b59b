"""Everything the leaderboard reads, as functions of a database path and plain filter values.

Safe by construction: the file is opened read-only (the published snapshot by default, so a running
`kvbench run` keeps its lock), every widget value reaches SQL as a bound parameter, and the output
text of a private task is never selected (nor stored: the runner keeps only ids for those).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, get_args

import duckdb
import pandas as pd

from kvbench.leaderboard.display import MISSING, parameters_text, setting_label
from kvbench.leaderboard.public import ROW_CAP
from kvbench.leaderboard.submissions import LOCAL, Notices, arm_badge, held_runs
from kvbench.leaderboard.submissions import notices as board_notices
from kvbench.results.compare import effect_text, holm_families, needed_text, plus_minus, task_tables
from kvbench.results.comparison import (
    RUNTIME,
    ArmResult,
    StoredRun,
    common_tasks,
    compare_table,
    stored_runs,
    task_metrics,
)
from kvbench.results.stats import Estimate, Verdict, bootstrap_mean, pool
from kvbench.results.summary import CellSummary, summarize
from kvbench.specs.metric_kind import Metric, pools
from kvbench.specs.protocol import NULL_POLICY
from kvbench.specs.resolved import Role
from kvbench.store.board_tables import LOCAL_SOURCE, counted_runs, tables
from kvbench.store.ingest import reading


def has_results(database: Path) -> bool:
    if not database.is_file():
        return False
    with reading(database) as con:
        return (
            "runs" in tables(con)
            and con.execute(f"SELECT count(*) FROM {counted_runs(con)}").fetchall()[0][0] > 0
        )


@dataclass(frozen=True)
class Compression:
    """A budget as the runs recorded it: K = N_avg/ratio, or a fixed K."""

    ratio: float | None
    budget: int | None

    @property
    def label(self) -> str:
        return f"{self.ratio:g}x (K = N_avg/{self.ratio:g})" if self.ratio else f"fixed K = {self.budget}"


@dataclass(frozen=True)
class Choices:
    models: list[str]
    protocols: list[str]
    compressions: list[Compression]
    runtimes: list[str]
    seeds: list[int]


DEFAULT_PROTOCOL = "protect-prompt"


def choices(
    database: Path,
    model: str | None = None,
    protocol: str | None = None,
    runtime: str | None = None,
    seed: int | None = None,
) -> Choices:
    """The filter values that have runs: models; the model's protocols; their runtimes and protocol
    seeds; then their compressions."""
    with reading(database) as con:
        models = _distinct(con, "model")
        model = model or (models[0] if models else None)
        protocols = _distinct(con, "protocol", ("model", model))
        # the Random Attention paper's protocol first, where it ran: the table a visitor expects
        protocols.sort(key=lambda name: name != DEFAULT_PROTOCOL)
        protocol = protocol or (protocols[0] if protocols else None)
        runtimes = _distinct(con, RUNTIME, ("model", model), ("protocol", protocol))
        runtime = runtime or (runtimes[0] if runtimes else None)
        seeds = _distinct(con, "protocol_seed", ("model", model), ("protocol", protocol), (RUNTIME, runtime))
        seed = seed if seed is not None else (seeds[0] if seeds else None)
        compressions = [
            Compression(ratio, None if ratio else budget)
            for ratio, budget in con.execute(
                f"SELECT DISTINCT ratio, CASE WHEN ratio IS NULL THEN budget END FROM {counted_runs(con)} "
                f"WHERE model = ? AND protocol = ? AND {RUNTIME} = ? AND protocol_seed = ? "
                "AND role <> ? ORDER BY ratio NULLS LAST, 2",
                [model, protocol, runtime, seed, Role.REFERENCE],
            ).fetchall()
        ]
    return Choices(models, protocols, compressions, runtimes, seeds)


def _distinct(con: duckdb.DuckDBPyConnection, column: str, *where: tuple[str, object]) -> list:
    """The values of ``column`` among the runs that match every (column, value) of ``where``, ascending
    (NULL last)."""
    matched = " AND ".join(["TRUE", *(f"{name} = ?" for name, _ in where)])
    query = f"SELECT DISTINCT {column} FROM {counted_runs(con)} WHERE {matched} ORDER BY 1"
    return [r[0] for r in con.execute(query, [value for _, value in where]).fetchall()]


def context_or_first(
    con: duckdb.DuckDBPyConnection, model: str, protocol: str, runtime: str | None, seed: int | None
) -> tuple[str, int]:
    """The runtime and protocol seed asked for, or the first (smallest) stored ones."""
    if runtime is None:
        found = _distinct(con, RUNTIME, ("model", model), ("protocol", protocol))
        runtime = next((r for r in found if r is not None), "")
    if seed is None:
        found = _distinct(con, "protocol_seed", ("model", model), ("protocol", protocol), (RUNTIME, runtime))
        seed = next((s for s in found if s is not None), 0)
    return runtime, seed


class ArmKey(NamedTuple):
    """An arm of a table: a policy with its parameters (the stored JSON) and its role, from one source
    (a submission's sha256 on a board, LOCAL_SOURCE for one's own runs)."""

    policy: str
    params: str
    role: Role
    source: str = LOCAL_SOURCE


POOLED = "pooled {}"
"""The label of a pool of one kind's tasks in a table that mixes kinds ("pooled pass/fail"): its columns
are named as a task's are ("pooled pass/fail verdict")."""


def column(group: str, name: str) -> str:
    """The column ``name`` (verdict, Δ vs null, ...) of one task or pool of a table of several tasks."""
    return f"{group} {name}"


@dataclass(frozen=True)
class Table:
    frame: pd.DataFrame
    tasks: list[str]
    average_over: list[str]
    """The tasks every arm in the table ran: what *average* (one kind of metric) or each pool pools."""
    run_ids: list[str]
    arms: list[ArmKey] = field(default_factory=list)
    """The arm of each row of ``frame``, in its order."""
    metrics: dict[str, Metric] = field(default_factory=dict)
    """Task -> the metric of its ranked quantity, with its kind (kvbench.specs.metric_kind)."""
    pools: dict[str, list[str]] = field(default_factory=dict)
    """Label -> tasks: the common tasks pooled, by kind; one label, "average", when they are of one
    kind, else POOLED labels for each kind with two tasks or more."""
    mismatched: list[str] = field(default_factory=list)
    """The shown arms whose problems are not the null's (one phrase each): what their paired columns rest
    on."""
    families: list[str] = field(default_factory=list)
    """What each Holm correction behind the table's verdicts ran over, one line per family
    (kvbench.results.compare.holm_families)."""

    @property
    def per_task(self) -> bool:
        """Whether each task has verdict columns of its own (a table of several tasks)."""
        return len(self.tasks) > 1


def _in_table(run: StoredRun, compression: Compression) -> bool:
    if run.role == Role.REFERENCE:
        return True
    if compression.ratio is not None:
        return run.ratio == compression.ratio
    return run.ratio is None and run.budget == compression.budget


def _interval(estimate: Estimate) -> str:
    return plus_minus(estimate.value, estimate.low, estimate.high)  # MISSING where there is none


def leaderboard(
    database: Path,
    model: str,
    protocol: str,
    compression: Compression,
    name: str = "",
    runtime: str | None = None,
    seed: int | None = None,
    quantity: str = "score",
) -> Table:
    """Rows = arms (the null and the full cache included), columns = tasks, their verdicts and pools.

    The numbers come from the comparison builder (kvbench.results.comparison), as in `kvbench compare`.
    Each task's verdict, Δ vs null and Holm p are those of `kvbench compare`'s table for that task (the
    columns "TASK verdict", ... where the table has several tasks). A pool averages the tasks every arm
    ran, clustered by (task, problem), and is tested as `kvbench compare --pool` tests it, Holm-corrected
    across every policy at this model, protocol and compression; tasks are pooled only with tasks whose
    metric is of the same kind: *average*, *verdict*, ... when the tasks are of one kind (a one-task
    table's are its task's), "pooled KIND ..." per kind when they mix. ``name`` then only selects which
    policies' rows are shown: a filter never changes the family of the correction, hence never a
    verdict. Each row names the submission holding its runs and their badge (re-computed by the operator).
    """
    with reading(database) as con:
        runs = table_runs(con, model, protocol, compression, runtime, seed)
        summaries = summarize(con, [r.run_id for r in runs], quantity)
        tasks = sorted({r.task for r in runs})
        common = common_tasks(runs)
        null = next((r.policy for r in runs if r.role == Role.NULL), NULL_POLICY)
        arms = compare_table(runs, summaries, tasks=common, also=tasks, baseline=null, quantity=quantity)
        shown = [a for a in arms if a.role != Role.POLICY or name.lower() in a.policy.lower()]
        run_ids = [run.run_id for arm in shown for run in arm.runs.values()]
        held = held_runs(con, run_ids)
        memory = _memory(con, run_ids)
    metrics = task_metrics(runs, quantity)
    by_kind = pools(metrics, common)
    groups = {"": common} if len(by_kind) == 1 else {k: t for k, t in by_kind.items() if len(t) > 1}
    tested = {
        label: _by_arm(compare_table(runs, summaries, tasks=members, baseline=null, quantity=quantity))
        for label, members in groups.items()
        if label
    }
    per_task = _per_task(runs, summaries, null, quantity) if len(tasks) > 1 else {}
    records = []
    for arm in shown:
        key = _key(arm)
        record = _record(arm, tasks, summaries) | _memory_columns(arm, memory)
        if "" in groups:
            record |= _tested(arm, "") | {"average": arm.score.value, "average ± CI": _interval(arm.score)}
        for label, results in tested.items():
            pooled = results.get(key)
            record |= {POOLED.format(label): _interval(pooled.score) if pooled else MISSING}
            record |= _tested(pooled, column(POOLED.format(label), ""), arm.role)
        for task, results in per_task.items():
            record |= _tested(results.get(key), column(task, ""), arm.role if task in arm.runs else None)
        submission, verified = arm_badge([run.run_id for run in arm.runs.values()], held)
        records.append(record | {"submission": submission, "verified": verified})
    mismatched = _mismatches(shown, tasks, summaries)
    for record, arm in zip(records, shown, strict=True):
        if (arm.policy, arm.params, arm.source) in mismatched:
            record["problems × samples"] += " ≠ null"
    frame = pd.DataFrame.from_records(records)
    keys = [_key(a) for a in shown]
    if not frame.empty:
        ranks = [_rank(arm, by_kind, summaries) for arm in shown]
        order = sorted(range(len(shown)), key=lambda i: ranks[i])  # stable: ties keep the builder's order
        frame = frame.loc[order].reset_index(drop=True)
        keys = [keys[i] for i in order]
    pool_labels = {("average" if not label else POOLED.format(label)): t for label, t in groups.items()}
    judged = [*arms, *(a for results in tested.values() for a in results.values())]
    judged += [a for results in per_task.values() for a in results.values()]
    families = holm_families((a.test.family, a.test.family_size) for a in judged if a.test is not None)
    return Table(
        frame, tasks, common, run_ids, keys, metrics, pool_labels, list(mismatched.values()), families
    )


def _key(arm: ArmResult) -> ArmKey:
    return ArmKey(arm.policy, arm.params, arm.role, arm.source)


def _by_arm(arms: list[ArmResult]) -> dict[ArmKey, ArmResult]:
    return {_key(a): a for a in arms}


def _per_task(
    runs: list[StoredRun], summaries: dict[str, CellSummary], null: str, quantity: str
) -> dict[str, dict[ArmKey, ArmResult]]:
    """Task -> its arms as `kvbench compare` tables them (one table per task and budget; at one
    compression a task has one budget, and a second one's arms would follow the first's)."""
    found: dict[str, dict[ArmKey, ArmResult]] = {}
    for table in task_tables(runs, summaries, null, quantity):
        found.setdefault(table.context[1], {}).update(_by_arm(table.arms))
    return found


def _rank(arm: ArmResult, by_kind: dict[str, list[str]], summaries: dict[str, CellSummary]) -> tuple:
    """Rows in descending order of each kind's mean over its tasks, kind after kind (never of a mean
    over tasks of two kinds); an arm without a kind's tasks last."""
    means = []
    for members in by_kind.values():
        values = list(
            pool({t: summaries[arm.runs[t].run_id].scores for t in members if t in arm.runs}).values()
        )
        means.append(-sum(values) / len(values) if values else math.inf)
    return tuple(means)


def _mismatches(
    arms: list[ArmResult], tasks: list[str], summaries: dict[str, CellSummary]
) -> dict[tuple[str, str, str], str]:
    """Arms ((policy, params, source) -> a phrase) that scored other problems than their null (the null
    of their own source) on this table's tasks: their cells average their own problems, while Δ vs null,
    W/T/L and the verdicts pair the shared ones. A policy with several settings in the table is named
    with its parameters."""

    def problems(arm: ArmResult) -> set[tuple[str, str]]:
        return {(t, p) for t in tasks if t in arm.runs for p in summaries[arm.runs[t].run_id].scores}

    nulls = {a.source: problems(a) for a in arms if a.role == Role.NULL}
    found = {}
    for arm in arms:
        expected = nulls.get(arm.source)
        if expected is None or arm.role == Role.NULL:
            continue
        held = problems(arm)
        if held != expected:
            settings = {a.params for a in arms if a.policy == arm.policy}
            name = arm.policy if len(settings) == 1 else setting_label(arm.policy, arm.params)
            found[(arm.policy, arm.params, arm.source)] = (
                f"{name} scored {len(held)} problems, the null {len(expected)}, both {len(held & expected)}"
            )
    return found


def table_runs(
    con: duckdb.DuckDBPyConnection,
    model: str,
    protocol: str,
    compression: Compression,
    runtime: str | None,
    seed: int | None,
) -> list[StoredRun]:
    """The runs of one table (the full cache's on the table's tasks only), in creation order."""
    runtime, seed = context_or_first(con, model, protocol, runtime, seed)
    runs = [
        r
        for r in stored_runs(con, model=model, protocol=protocol)
        if r.runtime == runtime and r.seed == seed and _in_table(r, compression)
    ]
    tasks = {r.task for r in runs if r.role != Role.REFERENCE}
    # the full cache serves every budget: only its runs on this table's tasks count here
    return [r for r in runs if r.task in tasks]


def _memory(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> dict[str, tuple[float, float, float]]:
    """Per run: (K held in tokens, the byte budget, N_avg), as its samples recorded them."""
    found = con.execute(
        "SELECT run_id, avg(kv_budget_tokens), avg(kv_budget_bytes), any_value(r.n_avg) FROM samples "
        f"JOIN {counted_runs(con)} r USING (run_id) WHERE list_contains(?, run_id) "
        "AND kv_budget_tokens IS NOT NULL "
        "GROUP BY run_id",
        [run_ids],
    ).fetchall()
    return {run_id: (tokens, nbytes, n_avg) for run_id, tokens, nbytes, n_avg in found}


def _memory_columns(arm: ArmResult, memory: dict[str, tuple[float, float, float]]) -> dict[str, float]:
    """What the arm's budget held and cost: K in tokens (over N_avg; more than K/N_avg when quantized
    tokens fit a byte budget), bytes per cached token, and the byte budget per sequence in MiB, averaged
    over the arm's tasks (NaN for the full cache)."""
    held = [memory[run.run_id] for run in arm.runs.values() if run.run_id in memory]
    if not held:
        return {"K held/N_avg": math.nan, "bytes/token": math.nan, "byte budget (MiB)": math.nan}
    return {
        "K held/N_avg": sum(tokens / n_avg for tokens, _, n_avg in held) / len(held),
        "bytes/token": sum(nbytes / tokens for tokens, nbytes, _ in held) / len(held),
        "byte budget (MiB)": sum(nbytes for _, nbytes, _ in held) / len(held) / 2**20,
    }


def _record(arm: ArmResult, tasks: list[str], summaries: dict[str, CellSummary]) -> dict:
    """The arm's own columns: its score per task and what its budget cost, pooled over its tasks."""
    record: dict = {"policy": arm.policy, "role": arm.role}
    for task in tasks:
        held = len(summaries[arm.runs[task].run_id].scores) if task in arm.runs else 0
        if task not in arm.per_task:
            record[task] = MISSING
        elif held == 1:  # one problem has no spread to show: never "± 0.000"
            record[task] = f"{arm.per_task[task].value:.3f} (1 problem)"
        else:
            record[task] = _interval(arm.per_task[task])
    record["tokens × full"] = arm.lengthening
    record["tokens / correct"] = arm.tokens_per_correct
    record["Δ tokens vs null"] = arm.tokens_vs_baseline.value if arm.tokens_vs_baseline else math.nan
    record["Δ trunc vs null"] = arm.truncation_vs_baseline.value if arm.truncation_vs_baseline else math.nan
    record["K/N_avg"] = arm.k_over_n_avg
    record["problems × samples"] = problems_by_samples([summaries[run.run_id] for run in arm.runs.values()])
    record["parameters"] = parameters_text(arm.params)
    return record


ROLES: dict[Role, str] = {Role.NULL: "null", Role.REFERENCE: "reference", Role.POLICY: "no matching null"}
"""The verdict cell of an arm that is not tested against the null, by its role."""


def _tested(arm: ArmResult | None, prefix: str, role: Role | None = None) -> dict:
    """One comparison's columns, each name after ``prefix`` (a task's or a pool's, or none): the verdict
    against the null and what it rests on. ``arm`` None: the arm is not in that comparison, and its
    verdict cell names its ``role`` (None: the arm did not run it)."""
    test = arm.test if arm is not None else None
    role = arm.role if arm is not None else role
    values = {
        "verdict": BADGES.get(test.verdict or "", MISSING) if test else ROLES[role] if role else MISSING,
        "Δ vs null": test.difference.value if test else (0.0 if role == Role.NULL else math.nan),
        "p (Holm)": test.p_adjusted if test else math.nan,
        "W/T/L": f"{test.wins}/{test.ties}/{test.losses}" if test else MISSING,
        "margin": test.margin if test else math.nan,
        "MDE": effect_text(test.minimum_detectable) if test else MISSING,
        "problems for 80% power": (  # what would decide an inconclusive row, at its differences
            needed_text(test.plan, differs=bool(test.wins or test.losses), margin=test.margin, short=True)
            if test and test.verdict == "inconclusive"
            else MISSING
        ),
        "Δ vs full": arm.vs_full.value if arm is not None and arm.vs_full else math.nan,
    }
    return {prefix + name: value for name, value in values.items()}


def problems_by_samples(cells: list[CellSummary]) -> str:
    """ "problems × samples per problem" over the problems that have a score; the samples counted are
    those problems' own (a task whose ranked quantity is missing adds neither)."""
    problems = sum(len(c.scores) for c in cells)
    per_problem = {round(c.samples / len(c.truncated)) for c in cells if c.scores and c.truncated}
    if not per_problem:
        return f"{problems} × 0"
    low, high = min(per_problem), max(per_problem)
    return f"{problems} × {low}" if low == high else f"{problems} × {low}–{high}"


BADGES = {verdict: verdict.removesuffix(" to null") for verdict in get_args(Verdict)}
"""A verdict's cell: *equivalent* and *loses* without "to null", *beats null* whole."""


_BENCH = """
SELECT policy, kind AS benchmark, adapter, budget, tokens, tokens_per_second, speed_vs_full,
       peak_kv_bytes / 2^20 AS peak_kv_mib, memory_vs_full, ms_per_event,
       CAST(details->>'peak_running' AS INTEGER) AS peak_running,
       CAST(details->>'preemptions' AS INTEGER) AS preemptions,
       machine->>'cpu' AS machine, to_timestamp(created) AS measured
FROM ({bench}) WHERE model = ?
QUALIFY row_number() OVER (PARTITION BY policy, kind, adapter ORDER BY created DESC) = 1
ORDER BY benchmark, adapter, policy
"""
_DECODE_ONLY = "SELECT *, 'decode' AS kind, 'hf' AS adapter, NULL::JSON AS details FROM bench"
"""A database written before `kvbench bench serve` existed: its bench rows are all hf decode rows."""


def efficiency(database: Path, model: str, scores: pd.DataFrame) -> pd.DataFrame:
    """The newest `kvbench bench decode` and `bench serve` row per policy and adapter for the model, beside
    the policy's average score where the table has one (its tasks of one kind of metric)."""
    with reading(database) as con:
        if "bench" not in tables(con):  # a database from before `kvbench bench decode --out` existed
            return pd.DataFrame()
        source = "SELECT * FROM bench" if "kind" in con.table("bench").columns else _DECODE_ONLY
        bench = con.execute(_BENCH.format(bench=source), [model]).df()
    if bench.empty or "average" not in scores:  # no average: the table's tasks are of two kinds
        return bench
    return bench.merge(scores[["policy", "average"]].drop_duplicates("policy"), on="policy", how="left")


def eviction_cost(database: Path, run_ids: list[str]) -> pd.DataFrame:
    """Per policy of the table's runs, what its eviction events cost in those runs: milliseconds per event
    of one sample (each sample's share of its batch's event time, over its events) and that over the
    null's, from the samples the runs recorded (no benchmark needed)."""
    with reading(database) as con:
        cost = con.execute(
            "SELECT r.policy, r.role, sum(s.evictions) AS events, "
            "1000 * sum(s.eviction_seconds) / nullif(sum(s.evictions), 0) AS ms_per_event "
            f"FROM samples s JOIN {counted_runs(con)} r USING (run_id) WHERE list_contains(?, run_id) "
            "GROUP BY r.policy, r.role HAVING sum(s.evictions) > 0 ORDER BY ms_per_event",
            [run_ids],
        ).df()
    null = cost.loc[cost["role"] == Role.NULL, "ms_per_event"]
    cost["× null"] = cost["ms_per_event"] / null.iloc[0] if len(null) == 1 else float("nan")
    return cost.drop(columns=["role"])


def policy_runs(database: Path, policy: str) -> pd.DataFrame:
    """Every stored run of one policy, with its score: the policy page's per-task results."""
    with reading(database) as con:
        runs = con.execute(
            "SELECT run_id, model, task, protocol, budget, ratio, policy_params AS parameters, visibility "
            f"FROM {counted_runs(con)} WHERE policy = ? ORDER BY model, task, protocol, ratio, budget",
            [policy],
        ).df()
        summaries = summarize(con, list(runs["run_id"]))
    estimates = [bootstrap_mean(list(summaries[r].scores.values())) for r in runs["run_id"]]
    runs["score"] = [e.value for e in estimates]
    runs["95% CI"] = [f"[{e.low:.3f}, {e.high:.3f}]" if e.problems else MISSING for e in estimates]
    runs["problems"] = [e.problems for e in estimates]
    runs["parameters"] = runs["parameters"].map(parameters_text)
    return runs


class Capped(NamedTuple):
    """The first rows of a selection, and how many it has in all."""

    frame: pd.DataFrame
    total: int

    @property
    def capped(self) -> bool:
        return self.total > len(self.frame)


def problems(database: Path, run_id: str, limit: int = ROW_CAP) -> Capped:
    """Per-sample rows of one run, the first ``limit`` of them. Output text only for public tasks: a
    private task's is never selected."""
    with reading(database) as con:
        rows = con.execute(
            "SELECT s.problem_id, s.sample, s.metric, s.correct, s.finish_reason, s.generated_tokens, "
            "s.evictions, CASE WHEN r.visibility = 'public' THEN s.output END AS output "
            f"FROM samples s JOIN {counted_runs(con)} r USING (run_id) WHERE s.run_id = ? "
            "ORDER BY s.problem_id, s.sample "
            "LIMIT ?",
            [run_id, limit],
        ).df()
        found = con.execute(
            f"SELECT count(*) FROM samples JOIN {counted_runs(con)} USING (run_id) WHERE run_id = ?", [run_id]
        ).fetchone()
    return Capped(rows, found[0] if found else 0)


_PROVENANCE = """
SELECT run_id, label, sha256(spec::VARCHAR)[:16] AS spec_sha256, adapter, device, dtype, attention,
       kvbench_version, git_sha, git_dirty,
       packages->>'torch' AS torch, hardware->>'torch_cuda' AS torch_cuda,
       packages->>'transformers' AS transformers, hardware->>'cpu' AS cpu,
       hardware->>'gpu' AS gpu, hardware->>'gpu_count' AS gpu_count, hardware->>'gpu_driver' AS gpu_driver,
       protocol_seed, samples_per_problem, to_timestamp(created) AS created
FROM {runs} WHERE list_contains(?, run_id) ORDER BY label
"""


def trust_notices(database: Path) -> Notices:
    """What the page says of the board's trust above every table (kvbench.leaderboard.submissions)."""
    with reading(database) as con:
        return board_notices(con)


def provenance(database: Path, run_ids: list[str]) -> pd.DataFrame:
    """Where every number came from: run, spec hash, versions, hardware, date; for a submitted run, its
    submission, whether its claim matched, and the operator's machine that re-computed it (CPU and GPU
    models)."""
    with reading(database) as con:
        runs = con.execute(_PROVENANCE.format(runs=counted_runs(con)), [run_ids]).df()
        held = held_runs(con, run_ids)
    held = held.rename(columns={"submitter": "submission"})
    runs = runs.merge(held, on="run_id", how="left")
    runs["submission"] = runs["submission"].fillna(LOCAL)
    return runs


def policy_documentation(database: Path, policy: str) -> list[dict]:
    """The documentation saved with the newest run of ``policy`` from each source (one's own runs, each
    submission): that of the code behind its numbers, each with ``from`` naming whose it is. Two
    submissions may ship a policy of one name; neither's documentation replaces the other's."""
    with reading(database) as con:
        found = con.execute(
            f"SELECT policy_doc, source FROM {counted_runs(con)} WHERE policy = ? AND policy_doc IS NOT NULL "
            "ORDER BY created DESC",
            [policy],
        ).fetchall()
        submitters = (
            dict(con.execute("SELECT bundle_sha256, submitter FROM submissions").fetchall())
            if "submissions" in tables(con)
            else {}
        )
    newest = dict(reversed([(source, doc) for doc, source in found]))
    return [
        json.loads(doc)
        | {
            "from": LOCAL
            if source == LOCAL_SOURCE
            else f"{submitters.get(source) or 'anonymous'} ({source[:12]})"
        }
        for source, doc in sorted(newest.items(), key=lambda item: item[0] != LOCAL_SOURCE)
    ]
