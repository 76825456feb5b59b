#!/bin/sh
# Lay out the kvbench leaderboard's Hugging Face Space in TARGET, ready to push: the entry point and its
# Streamlit config (deploy/space/), kvbench itself installed without its dependencies into vendor/ (the
# leaderboard never imports torch; kvbench is not on PyPI), and a publishable copy of the snapshot.
#
#   deploy/assemble-space.sh TARGET [SNAPSHOT]     # from the kvbench checkout
#
# SNAPSHOT defaults to runs/kvbench.snapshot.duckdb. PYTHON names the interpreter that runs pip and
# kvbench's publish step (default: .venv/bin/python, else python3).
set -eu
[ $# -ge 1 ] || { echo "usage: $0 TARGET [SNAPSHOT]" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
target=$1
snapshot=${2:-runs/kvbench.snapshot.duckdb}
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=python3
[ -f "$snapshot" ] || { echo "no snapshot at $snapshot (run kvbench ingest, or name one)" >&2; exit 1; }

mkdir -p "$target"
cp -R "$root/deploy/space/." "$target/"
rm -rf "$target/vendor"
"$python" -m pip install --quiet --no-deps --no-compile --target "$target/vendor" "$root"
"$python" -m kvbench.leaderboard.publish "$snapshot" "$target/data/kvbench.snapshot.duckdb"
echo "assembled $target: push it to the Space (track data/*.duckdb with Git LFS)"
