"""The leaderboard served by `kvbench leaderboard` and loaded in Debian's chromium, headless.

Playwright drives the system chromium (no browser download); the rendered DOM is checked for the
policies and a verdict badge, and a screenshot is kept in artifacts/ (or $KVBENCH_ARTIFACTS).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

KVBENCH = str(Path(sys.executable).parent / "kvbench")
ARTIFACTS = Path(os.environ.get("KVBENCH_ARTIFACTS", Path(__file__).resolve().parents[2] / "artifacts"))
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "Debian's chromium is not installed (`apt-get install chromium`; .ci/run installs it)"
        if os.environ.get("KVBENCH_REQUIRE_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_healthy(url: str, server: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"kvbench leaderboard exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout} s")


@pytest.mark.slow
def test_the_leaderboard_renders_in_headless_chromium(board_db: Path, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    executable = chromium()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [KVBENCH, "leaderboard", "--db", str(board_db), "--port", str(port)], stdout=log, stderr=log
    )
    try:
        wait_until_healthy(url, server)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch_persistent_context(
                str(tmp_path / "profile"),  # a fresh user-data-dir
                executable_path=executable,
                headless=True,
                args=FLAGS[1:],
                viewport={"width": 1600, "height": 1000},
            )
            try:
                page = browser.new_page()
                started = time.perf_counter()
                page.goto(url)
                board = page.get_by_role("tabpanel", name="Leaderboard")
                board.get_by_text("Against the null").wait_for(timeout=90_000)
                table = board.get_by_test_id("stDataFrame")
                # the grid paints on a canvas; its cells are in the DOM as an accessible (hidden) table
                table.locator("canvas").first.wait_for(state="visible", timeout=30_000)
                cell = table.locator("[role=gridcell]").filter(has_text="snapkv").first
                cell.wait_for(state="attached", timeout=30_000)
                seconds = time.perf_counter() - started
                text = table.text_content()
                for name in ("snapkv", "streaming", "random", "full", "fidelity", "passkey"):
                    assert name in text, name
                badges = board.locator("span.stMarkdownBadge").all_text_contents()
                assert len(badges) == 2 and set(badges) <= {"beats null", "ties", "loses"}, badges
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "leaderboard.png"), full_page=True)
                (ARTIFACTS / "leaderboard.dom.html").write_text(page.content())
                print(f"leaderboard table visible in chromium {seconds:.1f} s after navigation")
            finally:
                browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    with pytest.raises(OSError):  # stopping `kvbench leaderboard` stopped its Streamlit server too
        time.sleep(2)
        urllib.request.urlopen(f"{url}/_stcore/health", timeout=5)
