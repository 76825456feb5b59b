"""Peak memory and wall time of `kvbench accept` on hostile bundles, each just past one of the bounds of
kvbench.submissions (bundle, tables, rules), next to an honest bundle.

    python tools/bundle_bounds_cost.py HONEST.kvbench.tar.gz [--kvbench-path FOLDER]

HONEST is a genuine exported bundle (tests/submissions' fixture writes one). ``--kvbench-path`` runs
another kvbench (a folder holding a ``kvbench`` package, e.g. an older commit's ``suite`` exported as
``kvbench``) to compare; each accept runs in a process of its own, measured by getrusage.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests" / "submissions"


def _hostile(honest: Path, folder: Path) -> dict[str, Path]:
    sys.path[:0] = [str(TESTS), str(TESTS.parent)]
    import pyarrow.parquet as pq
    from hostile_archives import desynchronised  # type: ignore[import-not-found]
    from submitting import run_of  # type: ignore[import-not-found]
    from tampering import edit_samples, forged  # type: ignore[import-not-found]

    run_id = run_of(honest, "passkey", "keys-norm")

    def shard(edit_table):
        def edit(root: Path) -> None:
            path = sorted((root / "runs" / run_id).glob("*.parquet"))[0]
            table = pq.read_table(path)
            pq.write_table(edit_table(table), path, compression="zstd")

        return edit

    def long_strings(table):
        # 300 MiB decoded (one 1 MiB string on 300 rows) from a shard of a few kB: past 256 MiB
        return table.from_pylist([{**table.to_pylist()[0], "output": "x" * 2**20}] * 300, schema=table.schema)

    return {
        "honest": honest,
        "long name behind a pax size record (1 GiB announced)": desynchronised(
            folder / "desync.tar.gz", b"a", filler=2**30
        ),
        "shard rows (10,001)": forged(honest, folder / "rows.tar.gz", shard(lambda t: t.take([0] * 10_001))),
        "shard decoded bytes (300 MiB from a few kB)": forged(
            honest, folder / "decoded.tar.gz", shard(long_strings)
        ),
        "value range (metric 1.5)": forged(
            honest,
            folder / "range.tar.gz",
            lambda root: edit_samples(root, run_id, lambda row: row.update(metric=1.5)),
            output_digests=True,
        ),
    }


def _measure(bundle: Path, kvbench_path: str | None, scratch: Path) -> dict[str, float | int | str]:
    path = f"import sys; sys.path.insert(0, {kvbench_path!r}); " if kvbench_path else ""
    code = (
        f"{path}import resource, subprocess, sys, time; t = time.perf_counter(); "
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(done.returncode, time.perf_counter() - t, "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print((done.stdout + done.stderr)[-600:])"
    )
    runner = [sys.executable, "-c", f"import sys; {path}from kvbench.cli import main; sys.exit(main())"]
    db = scratch / f"board-{time.monotonic_ns()}.duckdb"
    out = subprocess.run(
        [sys.executable, "-c", code, *runner, "accept", str(bundle), "--db", str(db)],
        capture_output=True,
        text=True,
        cwd=scratch,
    ).stdout.splitlines()
    rc, seconds, kib = out[0].split()
    bounds = ("[member-header]", "[member-size]", "[row-count]", "[table-size]", "[value-range]")
    named = [line.strip() for line in out[1:] if any(rule in line for rule in bounds)]
    said = named[0] if named else " | ".join(line.strip() for line in out[1:3])
    return {
        "exit": int(rc),
        "seconds": round(float(seconds), 2),
        "max_rss_mib": int(kib) // 1024,
        "said": said,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("honest", type=Path)
    parser.add_argument("--kvbench-path", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        scratch = Path(name)
        for label, bundle in _hostile(args.honest.resolve(), scratch).items():
            measured = _measure(bundle, args.kvbench_path, scratch)
            print(json.dumps({"bundle": label, "size_kb": bundle.stat().st_size // 1000, **measured}))


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
