"""``kvbench leaderboard``: the Streamlit app on a results database, served on this machine."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    board = commands.add_parser("leaderboard", help="serve the leaderboard (Streamlit) on a results database")
    board.add_argument(
        "--db",
        type=Path,
        default=Path("runs") / "kvbench.snapshot.duckdb",
        help="database to read, read-only (default: the published snapshot runs/kvbench.snapshot.duckdb)",
    )
    board.add_argument("--port", type=int, default=8501)
    board.add_argument(
        "--address", default="127.0.0.1", help="address to listen on (default: this machine only)"
    )
    board.set_defaults(func=leaderboard_command)


def leaderboard_command(args: argparse.Namespace) -> int:
    import kvbench.leaderboard
    from kvbench.leaderboard.app import DATABASE_ENV

    app = Path(kvbench.leaderboard.__file__).with_name("app.py")
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        f"--server.port={args.port}",
        f"--server.address={args.address}",
        "--server.headless=true",
        "--browser.gatherUsageStats=false",
        "--client.toolbarMode=viewer",
    ]
    print(f"kvbench leaderboard: http://{args.address}:{args.port} reading {args.db}", flush=True)
    server = subprocess.Popen(command, env={**os.environ, DATABASE_ENV: str(args.db.resolve())})
    # `kill` of this process must end the server too, or a stopped leaderboard keeps its port
    signal.signal(signal.SIGTERM, lambda *_: server.terminate())
    try:
        return server.wait()
    except KeyboardInterrupt:
        server.terminate()
        server.wait()
        return 0
