"""Everything the leaderboard reads, as functions of a database path and plain filter values.

Safe by construction: the file is opened read-only (the published snapshot by default, so a running
`kvbench run` keeps its lock), every widget value reaches SQL as a bound parameter, and the output
text of a private task is never selected (nor stored: the runner keeps only ids for those).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pandas as pd

from kvbench.runner.summary import summarize
from kvbench.stats import bootstrap_mean, compare_arms, paired_difference, pool, verdicts

DRAWS = 2_000
"""Bootstrap draws behind every interval the app shows (the CLI uses 10,000; the app must stay fast)."""


@contextmanager
def connect(database: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect(str(database), read_only=True)
    try:
        yield con
    finally:
        con.close()


def has_results(database: Path) -> bool:
    if not database.is_file():
        return False
    with connect(database) as con:
        tables = {
            row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
        }
        return "runs" in tables and con.execute("SELECT count(*) FROM runs").fetchone()[0] > 0


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


def choices(database: Path, model: str | None = None) -> Choices:
    with connect(database) as con:
        models = [r[0] for r in con.execute("SELECT DISTINCT model FROM runs ORDER BY 1").fetchall()]
        model = model or (models[0] if models else None)
        protocols = [
            r[0]
            for r in con.execute(
                "SELECT DISTINCT protocol FROM runs WHERE model = ? ORDER BY 1", [model]
            ).fetchall()
        ]
        compressions = [
            Compression(ratio, None if ratio else budget)
            for ratio, budget in con.execute(
                "SELECT DISTINCT ratio, CASE WHEN ratio IS NULL THEN budget END FROM runs "
                "WHERE model = ? AND role <> 'reference' ORDER BY ratio NULLS LAST, 2",
                [model],
            ).fetchall()
        ]
    return Choices(models, protocols, compressions)


_RUNS = """
SELECT run_id, task, policy, policy_params, role, budget, n_avg, visibility FROM runs
WHERE model = ? AND protocol = ?
  AND (role = 'reference' OR (ratio = ?) OR (ratio IS NULL AND ? IS NULL AND budget = ?))
  AND (role <> 'policy' OR ? = '' OR contains(lower(policy), lower(?)))
ORDER BY task, policy, policy_params
"""


@dataclass(frozen=True)
class Arm:
    policy: str
    params: str
    role: str


@dataclass(frozen=True)
class Table:
    frame: pd.DataFrame
    tasks: list[str]
    run_ids: list[str]


def _arm_runs(
    con: duckdb.DuckDBPyConnection, model: str, protocol: str, compression: Compression, name: str
) -> dict[Arm, dict[str, tuple]]:
    ratio, budget = compression.ratio, compression.budget
    rows = con.execute(_RUNS, [model, protocol, ratio, ratio, budget, name, name]).fetchall()
    arms: dict[Arm, dict[str, tuple]] = {}
    for row in rows:
        arms.setdefault(Arm(row[2], row[3], row[4]), {})[row[1]] = row
    return arms


def _interval(estimate) -> str:
    if math.isnan(estimate.value):
        return "—"
    return f"{estimate.value:.3f} ± {(estimate.high - estimate.low) / 2:.3f}"


def leaderboard(database: Path, model: str, protocol: str, compression: Compression, name: str = "") -> Table:
    """Rows = policies (the null and the full cache included), columns = tasks and the pooled average.

    The average pools every task the arm ran, clustered by (task, problem); Δ vs the null and its
    verdict come from the paired sign test on those clusters, Holm-corrected across the table's policies.
    """
    with connect(database) as con:
        arms = _arm_runs(con, model, protocol, compression, name)
        tasks = sorted({task for arm, runs in arms.items() if arm.role != "reference" for task in runs})
        # the full cache serves every budget: only its runs on this table's tasks count here
        arms = {arm: {t: row for t, row in runs.items() if t in tasks} for arm, runs in arms.items()}
        run_ids = [row[0] for runs in arms.values() for row in runs.values()]
        summaries = summarize(con, run_ids)
    pooled = {
        arm: pool({task: summaries[row[0]].scores for task, row in runs.items() if task in tasks})
        for arm, runs in arms.items()
    }
    null = next((arm for arm in arms if arm.role == "null"), None)
    full = next((arm for arm in arms if arm.role == "reference"), None)
    tested = [arm for arm in arms if arm.role == "policy"] if null else []
    comparisons = verdicts([compare_arms(pooled[a], pooled[null], draws=DRAWS) for a in tested])
    tests = dict(zip(tested, comparisons, strict=True))
    records = []
    for arm, runs in arms.items():
        record: dict = {"policy": arm.policy, "role": arm.role}
        for task in tasks:
            record[task] = (
                _interval(bootstrap_mean(list(summaries[runs[task][0]].scores.values()), draws=DRAWS))
                if task in runs
                else "—"
            )
        average = bootstrap_mean(list(pooled[arm].values()), draws=DRAWS)
        record["average"] = average.value
        record["average ± CI"] = _interval(average)
        test = tests.get(arm)
        record["Δ vs null"] = test.difference.value if test else (0.0 if arm == null else math.nan)
        record["verdict"] = (
            _badge(test.verdict) if test else {"null": "null", "reference": "reference"}.get(arm.role, "—")
        )
        record["p (Holm)"] = test.p_adjusted if test else math.nan
        record["W/T/L"] = f"{test.wins}/{test.ties}/{test.losses}" if test else "—"
        vs_full = paired_difference(pooled[arm], pooled[full], draws=DRAWS) if full and arm != full else None
        record["Δ vs full"] = vs_full.value if vs_full else math.nan
        ratios = [row[5] / row[6] for row in runs.values() if row[5] and row[6]]
        record["K/N_avg"] = sum(ratios) / len(ratios) if ratios and arm.role != "reference" else math.nan
        samples = sum(summaries[row[0]].samples for task, row in runs.items() if task in tasks)
        record["samples × problems"] = f"{samples // max(len(pooled[arm]), 1)} × {len(pooled[arm])}"
        record["parameters"] = arm.params
        records.append(record)
    frame = pd.DataFrame.from_records(records)
    if not frame.empty:
        frame = frame.sort_values("average", ascending=False, kind="stable").reset_index(drop=True)
    return Table(frame, tasks, run_ids)


BADGES = {"beats null": "beats null", "ties null": "ties", "loses to null": "loses"}


def _badge(verdict: str | None) -> str:
    return BADGES.get(verdict or "", "—")


_CURVE_RUNS = """
SELECT run_id, task, policy, role, ratio FROM runs
WHERE model = ? AND protocol = ? AND (ratio IS NOT NULL OR role = 'reference') AND (? IS NULL OR task = ?)
ORDER BY ratio, policy
"""


def budget_curves(database: Path, model: str, protocol: str, task: str | None = None) -> pd.DataFrame:
    """Score against compression ratio per arm (pooled over tasks unless one is given), with 95% CIs.

    The full cache has no ratio: it appears once, with ``ratio`` missing, to be drawn as a line.
    """
    with connect(database) as con:
        rows = con.execute(_CURVE_RUNS, [model, protocol, task, task]).fetchall()
        summaries = summarize(con, [r[0] for r in rows])
    swept = {r[1] for r in rows if r[4] is not None}
    groups: dict[tuple, dict[str, dict]] = {}
    for run_id, task_name, policy, role, ratio in rows:
        if task_name in swept:  # the full cache's line pools the same tasks as the curves
            groups.setdefault((policy, role, ratio), {})[task_name] = summaries[run_id].scores
    records = []
    for (policy, role, ratio), by_task in groups.items():
        estimate = bootstrap_mean(list(pool(by_task).values()), draws=DRAWS)
        records.append(
            {
                "policy": policy,
                "role": role,
                "ratio": ratio,
                "score": estimate.value,
                "low": estimate.low,
                "high": estimate.high,
                "problems": estimate.problems,
            }
        )
    return pd.DataFrame.from_records(
        records, columns=["policy", "role", "ratio", "score", "low", "high", "problems"]
    )


def tasks(database: Path, model: str, protocol: str) -> list[str]:
    with connect(database) as con:
        return [
            r[0]
            for r in con.execute(
                "SELECT DISTINCT task FROM runs WHERE model = ? AND protocol = ? ORDER BY 1",
                [model, protocol],
            ).fetchall()
        ]


_BENCH = """
SELECT policy, budget, tokens, tokens_per_second, speed_vs_full, peak_kv_bytes / 2^20 AS peak_kv_mib,
       memory_vs_full, ms_per_event, machine->>'cpu' AS machine, to_timestamp(created) AS measured
FROM bench WHERE model = ?
QUALIFY row_number() OVER (PARTITION BY policy ORDER BY created DESC) = 1
ORDER BY policy
"""


def efficiency(database: Path, model: str, scores: pd.DataFrame) -> pd.DataFrame:
    """The newest `kvbench bench decode` row per policy for the model, beside the policy's average score."""
    with connect(database) as con:
        bench = con.execute(_BENCH, [model]).df()
    if bench.empty or scores.empty:
        return bench
    return bench.merge(scores[["policy", "average"]].drop_duplicates("policy"), on="policy", how="left")


def policy_runs(database: Path, policy: str) -> pd.DataFrame:
    """Every stored run of one policy, with its score: the policy page's per-task results."""
    with connect(database) as con:
        runs = con.execute(
            "SELECT run_id, model, task, protocol, budget, ratio, policy_params AS parameters, visibility "
            "FROM runs WHERE policy = ? ORDER BY model, task, protocol, ratio, budget",
            [policy],
        ).df()
        summaries = summarize(con, list(runs["run_id"]))
    estimates = [bootstrap_mean(list(summaries[r].scores.values()), draws=DRAWS) for r in runs["run_id"]]
    runs["score"] = [e.value for e in estimates]
    runs["95% CI"] = [f"[{e.low:.3f}, {e.high:.3f}]" for e in estimates]
    runs["problems"] = [e.problems for e in estimates]
    return runs


def problems(database: Path, run_id: str) -> pd.DataFrame:
    """Per-sample rows of one run. Output text only for public tasks: a private task's is never selected."""
    with connect(database) as con:
        return con.execute(
            "SELECT s.problem_id, s.sample, s.metric, s.correct, s.finish_reason, s.generated_tokens, "
            "s.evictions, CASE WHEN r.visibility = 'public' THEN s.output END AS output "
            "FROM samples s JOIN runs r USING (run_id) WHERE s.run_id = ? ORDER BY s.problem_id, s.sample",
            [run_id],
        ).df()


_PROVENANCE = """
SELECT run_id, label, sha256(spec::VARCHAR)[:16] AS spec_sha256, kvbench_version, git_sha, git_dirty,
       packages->>'torch' AS torch, packages->>'transformers' AS transformers, hardware->>'cpu' AS cpu,
       hardware->>'gpu' AS gpu, protocol_seed, samples_per_problem, to_timestamp(created) AS created
FROM runs WHERE list_contains(?, run_id) ORDER BY label
"""


def provenance(database: Path, run_ids: list[str]) -> pd.DataFrame:
    """Where every number came from: run, spec hash, versions, hardware, date."""
    with connect(database) as con:
        return con.execute(_PROVENANCE, [run_ids]).df()
