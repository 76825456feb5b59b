"""A copy of a results database fit to publish: the snapshot a Space or a container serves.

Public mode never selects what names the machine, but a Space's files can be downloaded, database and
all. So the copy leaves out the ingest's bookkeeping, every absolute path inside a resolved spec (a task
run with ``--data`` records its local folder), the platform string of every machine record (the runs',
the benchmarks', the machine that re-computed a submitted run) and who accepted a submission (a user
name). Everything the app reads is kept; a run's spec hash on the page is then that of its published
spec.

Usage: python -m kvbench.leaderboard.publish SOURCE.duckdb TARGET.duckdb
"""

from __future__ import annotations

import sys
from pathlib import Path

import duckdb

_PATH_VALUE = r'"(/|~/|[A-Za-z]:\\\\)[^"]*"'
"""A JSON string that is an absolute path: replaced by "…"."""


def _without_platform(column: str) -> str:
    patch = """'{"platform": null}'"""
    return f"CASE WHEN {column} IS NULL THEN NULL ELSE json_merge_patch({column}, {patch}) END"


_SELECT = {
    "runs": (
        f"SELECT * REPLACE (regexp_replace(spec::VARCHAR, '{_PATH_VALUE}', '\"…\"', 'g')::JSON AS spec, "
        f"{_without_platform('hardware')} AS hardware) FROM src.runs"
    ),
    "bench": f"SELECT * REPLACE ({_without_platform('machine')} AS machine) FROM src.bench",
    "submissions": "SELECT * REPLACE (NULL::VARCHAR AS accepted_by) FROM src.submissions",
    # a value analysis stores its provenance as JSON text, the machine record under "hardware"
    "value_analysis": (
        "SELECT * REPLACE (CASE WHEN provenance IS NULL THEN NULL ELSE json_merge_patch(provenance, "
        """'{"hardware": {"platform": null}}')::VARCHAR END AS provenance) FROM src.value_analysis"""
    ),
    "submission_runs": (
        f"SELECT * REPLACE ({_without_platform('machine')} AS machine) FROM src.submission_runs"
    ),
}
LEFT_OUT = {"ingested_files"}
"""Tables only the machine that ingests needs (which Parquet files it has merged)."""


def _identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier (DuckDB takes no parameter for a table's name)."""
    return '"' + name.replace('"', '""') + '"'


def public_copy(source: Path, target: Path) -> list[str]:
    """Write the publishable copy of ``source`` to ``target`` (replaced); returns the tables copied.

    Rows are selected into a fresh file, never updated in place, so no old value survives in its pages.
    """
    target.unlink(missing_ok=True)
    with duckdb.connect(str(target)) as con:
        con.execute("ATTACH ? AS src (READ_ONLY)", [str(source)])
        tables = [
            r[0]
            for r in con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_catalog = 'src' ORDER BY 1"
            ).fetchall()
        ]
        copied = [t for t in tables if t not in LEFT_OUT]
        for table in copied:
            name = _identifier(table)  # a table's name is read from the source: quoted, never SQL
            select = _SELECT.get(table, f"SELECT * FROM src.{name}")
            con.execute(f"CREATE TABLE {name} AS {select}")
        con.execute("DETACH src")
        con.execute("CHECKPOINT")
    return copied


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    copied = public_copy(Path(args[0]), Path(args[1]))
    print(f"{args[1]}: {', '.join(copied)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
