"""``kvbench compare``: every stored policy against the null (or another baseline), from the database.

Rows are grouped into tables by (model, task, protocol, budget); within a table each policy's sign test
against the baseline is Holm-corrected across the policies compared.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

import duckdb

from kvbench.runner.report import problem_scores
from kvbench.stats import bootstrap_mean, compare_arms, paired_difference, verdicts


@dataclass(frozen=True)
class Filters:
    model: str | None = None
    task: str | None = None
    protocol: str | None = None
    budget: int | None = None
    against: str = "random"


COLUMNS = (
    "model",
    "task",
    "protocol",
    "budget",
    "policy",
    "params",
    "score",
    "score_low",
    "score_high",
    "delta",
    "delta_low",
    "delta_high",
    "wins",
    "ties",
    "losses",
    "p_holm",
    "verdict",
    "delta_full",
    "problems",
    "excluded",
)


def compare(database: Path, filters: Filters) -> list[dict]:
    con = duckdb.connect(str(database), read_only=True)
    try:
        # every filter is a bound parameter: widget or CLI values never become SQL
        runs = con.execute(
            "SELECT run_id, model, task, protocol, budget, policy, policy_params, role FROM runs "
            "WHERE (? IS NULL OR model = ?) AND (? IS NULL OR task = ?) AND (? IS NULL OR protocol = ?) "
            "ORDER BY model, task, protocol, budget, policy",
            [filters.model, filters.model, filters.task, filters.task, filters.protocol, filters.protocol],
        ).fetchall()
        scores = {run[0]: problem_scores(con, run[0]) for run in runs}
    finally:
        con.close()
    references = {(r[1], r[2], r[3]): r[0] for r in runs if r[7] == "reference"}
    rows: list[dict] = []
    for key in dict.fromkeys((r[1], r[2], r[3], r[4]) for r in runs if r[4] is not None):
        if filters.budget is not None and key[3] != filters.budget:
            continue
        group = [r for r in runs if (r[1], r[2], r[3], r[4]) == key]
        baseline = next((r for r in group if r[5] == filters.against), None)
        arms = [r for r in group if r is not baseline and r[7] != "reference"]
        if baseline is None or not arms:
            continue
        tested = verdicts([compare_arms(scores[r[0]], scores[baseline[0]]) for r in arms])
        full = references.get(key[:3])
        for run, test in zip(arms, tested, strict=True):
            score = bootstrap_mean(list(scores[run[0]].values()))
            vs_full = paired_difference(scores[run[0]], scores[full]).value if full else None
            rows.append(
                dict(
                    zip(
                        COLUMNS,
                        (
                            *key,
                            run[5],
                            run[6],
                            score.value,
                            score.low,
                            score.high,
                            test.difference.value,
                            test.difference.low,
                            test.difference.high,
                            test.wins,
                            test.ties,
                            test.losses,
                            test.p_adjusted,
                            test.verdict,
                            vs_full,
                            score.problems,
                            len(test.excluded),
                        ),
                        strict=True,
                    )
                )
            )
    return rows


def render(rows: list[dict], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
        return buffer.getvalue()
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(display_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


HEADER = (
    "model",
    "task",
    "K",
    "policy",
    "score [95% CI]",
    "Δ vs baseline [95% CI]",
    "W/T/L",
    "verdict",
    "Δ vs full",
)


def display_cells(row: dict) -> list[str]:
    """The human-readable cells of one comparison row, in HEADER order (table and Markdown alike)."""
    return [
        row["model"],
        row["task"],
        str(row["budget"]),
        row["policy"],
        f"{row['score']:.3f} [{row['score_low']:.3f}, {row['score_high']:.3f}]",
        f"{row['delta']:+.3f} [{row['delta_low']:+.3f}, {row['delta_high']:+.3f}]",
        f"{row['wins']}/{row['ties']}/{row['losses']}",
        f"{row['verdict']} (p={row['p_holm']:.3f})",
        "—" if row["delta_full"] is None else f"{row['delta_full']:+.3f}",
    ]
