"""The kvbench leaderboard as a Hugging Face Space (Streamlit SDK) or a container: public mode on the
published snapshot shipped beside this file (data/kvbench.snapshot.duckdb), or on the one that
KVBENCH_LEADERBOARD_DB names (the container's mounted or baked-in /data).

kvbench is not on PyPI and its declared dependencies include torch, which the leaderboard never imports:
the Space carries kvbench installed with ``pip install --no-deps --target vendor`` (see deploy/README.md),
and this entry puts vendor/ on the import path when it is there.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SNAPSHOT = HERE / "data" / "kvbench.snapshot.duckdb"
VENDOR = HERE / "vendor"


def main() -> None:
    if VENDOR.is_dir() and str(VENDOR) not in sys.path:
        sys.path.insert(0, str(VENDOR))
    from kvbench.leaderboard.app import DATABASE_ENV
    from kvbench.leaderboard.app import main as leaderboard

    leaderboard(database=Path(os.environ.get(DATABASE_ENV) or SNAPSHOT), public=True)


if __name__ == "__main__":
    main()
