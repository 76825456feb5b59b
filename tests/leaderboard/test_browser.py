"""The leaderboard served by `kvbench leaderboard --public` and loaded in Debian's chromium, headless.

Playwright drives the system chromium (no browser download); one server and one browser serve every
test, each in a fresh context. The rendered DOM is checked for the policies, a verdict badge and the
absence of local paths, and a permalink is opened on the head-to-head it names; screenshots are kept
in artifacts/ (or $KVBENCH_ARTIFACTS).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from built import built_once
from invoke import kvbench

from kvbench.leaderboard.display import JOINER

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

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


@contextlib.contextmanager
def serving(database: Path, folder: Path, *flags: str) -> Iterator[str]:
    """`kvbench leaderboard` on ``database`` with ``flags``, its log in ``folder``: its address, while
    it runs; stopped afterwards."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (folder / "server.log").open("w") as log:
        command = [KVBENCH, "leaderboard", "--db", str(database), "--port", str(port), *flags]
        server = subprocess.Popen(command, stdout=log, stderr=log)
        try:
            wait_until_healthy(url, server)
            yield url
        finally:
            server.terminate()
            server.wait(timeout=30)


@pytest.fixture(scope="module")
def served(board_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `kvbench leaderboard --public` for every test here; stopping it must stop Streamlit too."""
    with serving(board_db, tmp_path_factory.mktemp("served"), "--public") as url:
        yield url
    with pytest.raises(OSError):  # stopping `kvbench leaderboard` stopped its Streamlit server too
        time.sleep(2)
        urllib.request.urlopen(f"{url}/_stcore/health", timeout=5)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless chromium for every test here (a test that needs the shared board asks for served)."""
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, headless=True, args=FLAGS[1:])
        try:
            yield launched
        finally:
            launched.close()


def fresh_page(browser: Browser) -> Page:
    """A page in a new context: no cookies, storage or session of an earlier test."""
    return browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()


@pytest.mark.slow
def test_the_public_leaderboard_renders_in_headless_chromium(
    served: str, browser: Browser, board_db: Path
) -> None:
    page = fresh_page(browser)
    started = time.perf_counter()
    page.goto(served)
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
    # two policies, each with its verdict on passkey and on fidelity (two kinds of metric, never pooled)
    assert len(badges) == 4 and set(badges) <= {"beats null", "equivalent", "inconclusive", "loses"}, badges
    page.get_by_text("Published snapshot").wait_for(state="attached", timeout=30_000)
    dom = page.content()
    assert str(board_db.parents[1]) not in dom and "database:" not in dom  # no local path in public mode
    # the page writes its selection into the address bar once its script run ends: wait for it, then check
    page.wait_for_function("() => location.search.includes('compression=2x')", timeout=30_000)
    assert "compression=2x" in page.url
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "leaderboard.png"), full_page=True)
    (ARTIFACTS / "leaderboard.dom.html").write_text(dom)
    print(f"leaderboard table visible in chromium {seconds:.1f} s after navigation")
    page.context.close()


@pytest.mark.slow
def test_a_permalink_opens_the_head_to_head_it_names(served: str, browser: Browser) -> None:
    query = {"compression": "K384", "view": "Head-to-head", "pair_a": "snapkv", "pair_b": "full (full cache)"}
    page = fresh_page(browser)
    page.goto(f"{served}/?{urllib.parse.urlencode(query)}")
    panel = page.get_by_role("tabpanel", name="Head-to-head")
    grid = panel.get_by_test_id("stDataFrame").first
    grid.locator("[role=gridcell]").filter(has_text="pooled").first.wait_for(state="attached", timeout=90_000)
    assert "gsm8k" in grid.text_content() and "gpqa-diamond" in grid.text_content()  # both pass/fail
    assert panel.get_by_test_id("stPlotlyChart").count() == 1
    assert page.get_by_role("tab", name="Head-to-head").get_attribute("aria-selected") == "true"

    def chosen(label: str) -> str:  # a selectbox is a combobox named by its label, holding its value
        return page.get_by_role("combobox", name=label, exact=True).input_value()

    assert chosen("compression") == "fixed K = 384"
    assert (chosen("A"), chosen("B")) == ("snapkv", "full (full cache)")
    assert all(f"{k}={urllib.parse.quote_plus(v)}" in page.url for k, v in query.items()), page.url
    page.screenshot(path=str(ARTIFACTS / "leaderboard-head-to-head.png"), full_page=True)
    page.context.close()


@pytest.mark.slow
def test_the_retention_view_renders_its_table_and_figures(served: str, browser: Browser) -> None:
    page = fresh_page(browser)
    page.goto(f"{served}/?{urllib.parse.urlencode({'compression': '2x', 'view': 'Retention'})}")
    panel = page.get_by_role("tabpanel", name="Retention")
    grid = panel.get_by_test_id("stDataFrame").first
    grid.locator("[role=gridcell]").filter(has_text="random (null)").first.wait_for(
        state="attached", timeout=90_000
    )
    assert "streaming" in grid.text_content() and "snapkv" in grid.text_content()
    panel.get_by_test_id("stPlotlyChart").nth(4).wait_for(state="attached", timeout=30_000)
    assert panel.get_by_test_id("stPlotlyChart").count() == 5  # four list figures and recall by events
    page.screenshot(path=str(ARTIFACTS / "leaderboard-retention.png"), full_page=True)
    page.context.close()


def _grid_state(page: Page, index: int = 0) -> dict:
    """A table's horizontal extent, the column headers the grid has rendered (it renders only the columns
    in view, so a header listed here is one a reader can see) and its top edge on the page; ``index``
    counts the tables visible in the open tab, the main table first."""
    return page.evaluate(
        """(index) => {
          const grids = [...document.querySelectorAll('[data-testid=stDataFrame]')];
          const grid = grids.filter(g => g.offsetParent !== null)[index];
          const scroller = grid.querySelector('.dvn-scroller');
          const heads = [...grid.querySelectorAll('[role=columnheader]')].map(h => h.textContent);
          const top = grid.getBoundingClientRect().top;
          return {scroll: scroller.scrollWidth, client: scroller.clientWidth, heads: heads, top: top};
        }""",
        index,
    )


@pytest.mark.slow
def test_the_table_fits_1600_pixels_and_keeps_the_policy_in_view_at_800(
    served: str, browser: Browser
) -> None:
    for width in (1600, 800):
        page = browser.new_context(viewport={"width": width, "height": 1000}).new_page()
        page.goto(served)
        board = page.get_by_role("tabpanel", name="Leaderboard")
        board.get_by_text("Against the null").wait_for(timeout=90_000)
        grid = board.get_by_test_id("stDataFrame")
        grid.locator("[role=columnheader]").filter(has_text="verdict").first.wait_for(state="attached")
        state = _grid_state(page)
        verdicts = ["fidelity verdict", "passkey verdict"]
        if width == 1600:  # the whole compact table, nothing clipped
            assert state["scroll"] <= state["client"], state
            assert state["heads"][:3] == ["policy", *verdicts] and state["heads"][-1] == "problems × samples"
        else:  # wider than the screen: the verdicts open it; scrolled to its far end, the policy stays
            assert state["scroll"] > state["client"], state
            assert state["heads"][:3] == ["policy", *verdicts], state
            page.evaluate(
                "() => { const s = document.querySelector('.dvn-scroller'); s.scrollLeft = s.scrollWidth; }"
            )
            page.wait_for_timeout(500)
            assert {"policy", "problems × samples"} <= set(_grid_state(page)["heads"])
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"leaderboard-{width}px.png"))
        page.context.close()


@pytest.mark.slow
def test_at_1280_pixels_no_table_is_clipped_and_the_main_table_is_above_the_fold(
    served: str, browser: Browser
) -> None:
    """A laptop screen: the main table starts in the first screenful, and the Retention and Provenance
    tables are whole (no column cut off at the right edge)."""
    tables = {
        "Leaderboard": (1, "fidelity verdict"),
        "Retention": (1, "coverage"),
        "Provenance": (2, "value"),
    }
    for view, (count, header) in tables.items():
        page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
        page.goto(f"{served}/?{urllib.parse.urlencode({'compression': '2x', 'view': view})}")
        panel = page.get_by_role("tabpanel", name=view)
        grid = panel.get_by_test_id("stDataFrame").nth(count - 1)
        grid.locator("[role=columnheader]").filter(has_text=header).first.wait_for(
            state="attached", timeout=90_000
        )
        for index in range(count):
            state = _grid_state(page, index)
            assert state["scroll"] <= state["client"], (view, index, state)
        if view == "Leaderboard":
            assert _grid_state(page)["top"] < 800 / 2, _grid_state(page)  # in the upper half of the screen
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"leaderboard-1280px-{view.lower()}.png"))
        page.context.close()


@pytest.mark.slow
def test_one_ratio_shows_points_the_null_band_and_the_full_cache(
    one_ratio_db: Path, browser: Browser, tmp_path: Path
) -> None:
    """After `make run` (one ratio) the budget view draws something visible: a point per arm, the null's
    band and the full cache's line (plotly's shapes layer), and says that a curve needs more ratios."""
    with serving(one_ratio_db, tmp_path) as url:
        page = fresh_page(browser)
        page.goto(f"{url}/?view=Budget+curves")
        panel = page.get_by_role("tabpanel", name="Budget curves")
        panel.get_by_text("one compression ratio").wait_for(timeout=90_000)
        chart = panel.get_by_test_id("stPlotlyChart")
        points = chart.locator("g.scatterlayer path.point")
        points.first.wait_for(state="attached", timeout=30_000)
        assert points.count() == 3  # h2o, snapkv and the null
        assert chart.locator("g.shape-group path").count() == 2  # the null's band and the full cache's line
        legend = chart.locator("g.legend").text_content()
        assert "full cache" in legend and "Random Attention (null) 95% CI" in legend
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "leaderboard-one-ratio.png"), full_page=True)
        page.context.close()


MARKUP = (
    "<img src=x onerror=alert(1)> **bold** [link](http://example.com) ![pixel](http://127.0.0.1:9/p.png) "
    "<b>b</b>"
)
"""HTML, emphasis, a link and an image, and a tag plotly reads: what a submitter could write in a
parameter, a docstring or the bundle's submitter and description."""
HOSTILE_SCORER = f'''"""Module notes: {MARKUP}"""

from kvbench import EvictionView, Policy, policy


@policy("hostile")
class Hostile(Policy):
    """Summary: {MARKUP}"""

    note: str = {MARKUP!r}

    def score(self, view: EvictionView):
        return view.keys.float().norm(dim=-1)
'''


@pytest.fixture(scope="module")
def hostile_board(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A board from a real bundle whose scorer's parameter and docstrings and whose submitter and
    description hold MARKUP: its default setting ran one problem, its other setting and the null two, so
    the page names the default setting, parameters and all, in its "Marked ≠ null" warning."""

    def build(root: Path) -> Path:
        (root / "hostile.py").write_text(HOSTILE_SCORER)
        run = ("run", "--model", "tiny-qwen3", "--task", "fidelity", "--samples", "1", "--quiet")
        for setting, limit in (("hostile.py:Hostile:note=plain", "2"), ("hostile.py:Hostile", "1")):
            done = kvbench(*run, "--policy", setting, "--limit", limit, cwd=root)
            assert done.returncode == 0, done.stdout + done.stderr
        for args in (
            ("export", "bundle.tar.gz", "--scorer", "hostile.py", "--submitter", f"Mallory {MARKUP}"),
            ("accept", "bundle.tar.gz", "--db", "board.duckdb"),
            ("verify", "bundle.tar.gz", "--db", "board.duckdb", "--quiet"),  # the board scores only that
        ):
            extra = ("--description", MARKUP) if args[0] == "export" else ()
            done = kvbench(*args, *extra, cwd=root)
            assert done.returncode == 0, done.stdout + done.stderr
        return root / "board.snapshot.duckdb"

    return built_once(tmp_path_factory, "hostile-board", build)


@pytest.mark.slow
def test_text_from_a_bundle_is_shown_as_text_never_as_markup(
    hostile_board: Path, browser: Browser, tmp_path: Path
) -> None:
    with serving(hostile_board, tmp_path) as url:
        page = fresh_page(browser)
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(url)
        board = page.get_by_role("tabpanel", name="Leaderboard")
        warning = board.get_by_text("Marked ≠ null")
        warning.wait_for(timeout=90_000)
        # the setting's parameters, character for character, in the warning's text (where a bare link
        # would begin, an invisible word joiner keeps GFM from linking it)
        shown = warning.text_content().replace(JOINER, "")
        assert f"hostile (note={MARKUP}) scored 1 problems" in shown, shown
        page.goto(f"{url}/?{urllib.parse.urlencode({'view': 'Policy', 'policy': 'hostile'})}")
        panel = page.get_by_role("tabpanel", name="Policy")
        panel.get_by_text(f"hostile — Summary: {MARKUP}").wait_for(timeout=90_000)
        panel.get_by_text(f"Module notes: {MARKUP}").wait_for(timeout=30_000)
        pair = {"pair_a": f"hostile (note={MARKUP})", "pair_b": "random (null)"}
        for view in ("Leaderboard", "Head-to-head", "Provenance"):
            page.goto(f"{url}/?{urllib.parse.urlencode({'view': view, **pair})}")
            panel = page.get_by_role("tabpanel", name=view)
            panel.get_by_test_id("stDataFrame").first.wait_for(timeout=90_000)
            if view == "Head-to-head":  # plotly reads <a href>, <b> and <br> in a title
                title = panel.locator(".gtitle").first
                title.wait_for(state="attached", timeout=30_000)
                assert title.text_content() == f"A = hostile (note={MARKUP}) against B = random (null)"
            if view == "Provenance":  # the submitter, in its cell of what every run shares (at the end)
                shared = panel.get_by_test_id("stDataFrame").nth(1)
                shared.locator(".dvn-scroller").evaluate("s => { s.scrollTop = s.scrollHeight; }")
                cell = shared.locator("[role=gridcell]").filter(has_text="Mallory").first
                cell.wait_for(state="attached", timeout=30_000)
                assert cell.text_content() == f"Mallory {MARKUP}", cell.text_content()
            # no element the markup would have made, on any view
            assert page.locator("img[src='x'], img[src*='127.0.0.1:9'], a[href*='example.com']").count() == 0
            assert page.locator("strong", has_text="bold").count() == 0, view
        assert dialogs == []
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "leaderboard-hostile-text.png"), full_page=True)
        page.context.close()


FAILS_WHEN_CHECKED = '''"""Scores by key norm for its submitter; raises behind the sandbox (no /etc)."""
import os

from kvbench import EvictionView, Policy, policy


@policy("fails-when-checked")
class FailsWhenChecked(Policy):
    def score(self, view: EvictionView):
        if not os.path.isdir("/etc"):
            raise RuntimeError("only on the submitter's machine")
        return view.keys.float().norm(dim=-1)
'''


@pytest.fixture(scope="module")
def waiting_board(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A board as an operator leaves it after docs/submissions.md's commands: Frank's bundle verified,
    its scorer failing under re-computation (its null re-computed), and Pat's bundle accepted, not yet
    verified."""

    def build(root: Path) -> Path:
        run = (
            "run",
            "--model",
            "tiny-qwen3",
            "--task",
            "fidelity",
            "--samples",
            "1",
            "--limit",
            "2",
            "--quiet",
        )
        for who, policy in (("Frank", "fails.py:FailsWhenChecked"), ("Pat", "snapkv")):
            folder = root / who
            folder.mkdir()
            (folder / "fails.py").write_text(FAILS_WHEN_CHECKED)
            done = kvbench(*run, "--policy", policy, cwd=folder)
            assert done.returncode == 0, done.stdout + done.stderr
            scorer = ("--scorer", "fails.py") if who == "Frank" else ()
            done = kvbench("export", "bundle.tar.gz", *scorer, "--submitter", who, cwd=folder)
            assert done.returncode == 0, done.stdout + done.stderr
            done = kvbench("accept", str(folder / "bundle.tar.gz"), "--db", "board.duckdb", cwd=root)
            assert done.returncode == 0, done.stdout + done.stderr
        done = kvbench(
            "verify", str(root / "Frank" / "bundle.tar.gz"), "--db", "board.duckdb", "--quiet", cwd=root
        )
        assert done.returncode == 1, done.stdout + done.stderr  # one run failed
        return root / "board.snapshot.duckdb"

    return built_once(tmp_path_factory, "waiting-board", build)


@pytest.mark.slow
def test_a_failed_run_and_a_pending_submission_show_no_score_and_are_named(
    waiting_board: Path, browser: Browser, tmp_path: Path
) -> None:
    with serving(waiting_board, tmp_path, "--public") as url:
        page = fresh_page(browser)
        page.goto(url)
        board = page.get_by_role("tabpanel", name="Leaderboard")
        board.get_by_text("could not be re-computed here and never count").wait_for(timeout=90_000)
        board.get_by_text("1 submission(s) wait for the maintainer").wait_for(timeout=30_000)
        grids = board.get_by_test_id("stDataFrame")
        grids.first.locator("[role=gridcell]").first.wait_for(state="attached", timeout=30_000)
        texts = [grids.nth(i).text_content() or "" for i in range(grids.count())]
        (failed,) = [t for t in texts if "only on the submitter's machine" in t]
        assert "fails-when-checked" in failed and "RuntimeError" in failed, failed
        (pending,) = [t for t in texts if "Pat" in t]
        # its columns: submitter, bundle, accepted_at, pending, runs (snapkv, the null, the full cache)
        assert pending.startswith("submitterbundleaccepted_atpendingrunsPat"), pending
        assert pending.endswith("33"), pending
        scored = [t for t in texts if "random" in t and t not in (failed, pending)]
        assert scored, texts  # Frank's null, re-computed, is on the board
        for text in scored:  # neither the failed policy nor Pat's unverified snapkv has a scored row
            assert "fails-when-checked" not in text and "snapkv" not in text, text
        assert board.locator("span.stMarkdownBadge").count() == 0  # no verdict: no policy is paired with it
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "leaderboard-waiting.png"), full_page=True)
        page.context.close()
