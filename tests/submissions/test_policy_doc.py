"""A submitted run carries its policy's documentation (policy_doc, outside the run's identity). The page
shows the documentation of the run the operator re-computed: a forger who rewrites it for a built-in
policy gets kvbench's own on the page, and nothing of theirs is rendered as Markdown (no image fetched
from elsewhere, no heading of their own)."""

from __future__ import annotations

from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from streamlit.testing.v1 import AppTest
from submitting import HUB, cli, run_of
from tampering import edit_manifest, forged

import kvbench.leaderboard
from kvbench.leaderboard.app import DATABASE_ENV
from kvbench.leaderboard.public import PUBLIC_ENV
from kvbench.leaderboard.queries import Compression
from kvbench.registry import make_policy, policy_documentation

APP = str(Path(kvbench.leaderboard.__file__).with_name("app.py"))
GPQA_DATA = f"gpqa-diamond={HUB / 'Idavidrein/gpqa'}"
SUMMARY = "Fastest eviction ![pixel](https://tracker.example/p.png) [docs](https://tracker.example/)"
MODULE_DOC = "# Certified by kvbench\n\n<img src=https://tracker.example/i.png>\n\n**Trust me.**"


def _rewrite_doc(run_id: str):
    def edit(folder: Path) -> None:
        edit_manifest(
            folder, run_id, lambda run: run["policy_doc"].update(summary=SUMMARY, module_doc=MODULE_DOC)
        )

    return edit


def _board(bundle: Path, root: Path) -> Path:
    """``bundle`` accepted and re-computed on a fresh board in ``root``; its snapshot."""
    db = root / "board.duckdb"
    cli("accept", str(bundle), "--db", str(db), cwd=root)
    cli("verify", str(bundle), "--db", str(db), "--data", GPQA_DATA, "--quiet", cwd=root)
    return root / "board.snapshot.duckdb"


def test_a_forged_policy_doc_never_reaches_the_page(
    submission: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    target = run_of(bundle, "gpqa-diamond", "snapkv")  # a built-in policy's run
    bad = forged(bundle, tmp_path / "doc.tar.gz", _rewrite_doc(target))
    monkeypatch.setenv(DATABASE_ENV, str(_board(bad, tmp_path)))  # policy_doc is no rule's business
    monkeypatch.setenv(PUBLIC_ENV, "1")
    app = AppTest.from_file(APP, default_timeout=120).run()
    app.sidebar.selectbox(key="compression").set_value(Compression(None, 384)).run()
    app.selectbox(key="policy").set_value("snapkv").run()
    assert not app.exception, app.exception
    texts = [t.value for t in app.text]
    assert not any(SUMMARY in t or MODULE_DOC in t for t in texts), texts
    ours = make_policy("snapkv")
    assert f"snapkv — {policy_documentation(ours)['summary']}" in texts  # what the operator's run recorded
    rendered = MarkdownIt("commonmark").enable("table")
    for element in [*app.markdown, *app.caption, *app.info, *app.error]:
        html = rendered.render(str(element.value))
        assert "tracker.example" not in html and "<img" not in html, element.value
        assert "Certified by kvbench" not in html, element.value


def test_a_file_scorer_is_shown_by_its_file_name(
    submission: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Policy tab names the file a scorer came from, not the module name kvbench ran it under."""
    monkeypatch.setenv(DATABASE_ENV, str(_board(submission / "bundle.kvbench.tar.gz", tmp_path)))
    app = AppTest.from_file(APP, default_timeout=120).run()
    app.selectbox(key="policy").set_value("keys-norm").run()
    assert not app.exception, app.exception
    (source,) = [t.value for t in app.text if t.value.startswith("source: ")]
    # the run the operator re-computed: the bundle's scorer member, run isolated
    assert source.startswith("source: keys-norm.py (isolated scorer file) (as stored with its newest run)"), (
        source
    )
    assert "kvbench_user_policy" not in source
