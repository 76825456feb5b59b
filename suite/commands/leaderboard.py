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
    board.add_argument(
        "--public",
        action="store_true",
        help="serve it to anyone: no local paths on the page, bounded tables, no error details",
    )
    board.set_defaults(func=leaderboard_command)


def leaderboard_command(args: argparse.Namespace) -> int:
    import kvbench.leaderboard
    from kvbench.leaderboard.app import DATABASE_ENV
    from kvbench.leaderboard.public import PUBLIC_ENV
    from kvbench.leaderboard.queries import has_results

    if args.db.exists():
        has_results(args.db)  # an empty or damaged file fails here, named, before a server starts

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
        # a traceback would show visitors this machine's paths
        *(["--client.showErrorDetails=none"] if args.public else []),
    ]
    mode = " (public)" if args.public else ""
    print(f"kvbench leaderboard{mode}: http://{args.address}:{args.port} reading {args.db}", flush=True)
    env = {**os.environ, DATABASE_ENV: str(args.db.resolve()), PUBLIC_ENV: "1" if args.public else ""}
    server = subprocess.Popen(command, env=env)
    # `kill` of this process must end the server too, or a stopped leaderboard keeps its port
    signal.signal(signal.SIGTERM, lambda *_: server.terminate())
    try:
        return server.wait()
    except KeyboardInterrupt:
        server.terminate()
        server.wait()
        return 0
