"""A submitted run carries its policy's documentation (policy_doc, outside the run's identity), and the
public page shows it: a forger who rewrites it for a built-in policy gets plain text on the page, never
an image fetched from elsewhere nor a heading of their own."""

from __future__ import annotations

from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from streamlit.testing.v1 import AppTest
from submitting import cli, run_of
from tampering import edit_manifest, forged

import kvbench.leaderboard
from kvbench.leaderboard.app import DATABASE_ENV
from kvbench.leaderboard.public import PUBLIC_ENV
from kvbench.leaderboard.queries import Compression

APP = str(Path(kvbench.leaderboard.__file__).with_name("app.py"))
SUMMARY = "Fastest eviction ![pixel](https://tracker.example/p.png) [docs](https://tracker.example/)"
MODULE_DOC = "# Certified by kvbench\n\n<img src=https://tracker.example/i.png>\n\n**Trust me.**"


def _rewrite_doc(run_id: str):
    def edit(folder: Path) -> None:
        edit_manifest(
            folder, run_id, lambda run: run["policy_doc"].update(summary=SUMMARY, module_doc=MODULE_DOC)
        )

    return edit


def test_a_submitted_policy_doc_is_shown_as_plain_text(
    submission: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    target = run_of(bundle, "gpqa-diamond", "snapkv")  # a built-in policy's run
    bad = forged(bundle, tmp_path / "doc.tar.gz", _rewrite_doc(target))
    db = tmp_path / "board.duckdb"
    cli("accept", str(bad), "--db", str(db), cwd=tmp_path)  # policy_doc is no rule's business
    monkeypatch.setenv(DATABASE_ENV, str(tmp_path / "board.snapshot.duckdb"))
    monkeypatch.setenv(PUBLIC_ENV, "1")
    app = AppTest.from_file(APP, default_timeout=120).run()
    app.sidebar.selectbox(key="compression").set_value(Compression(None, 384)).run()
    app.selectbox(key="policy").set_value("snapkv").run()
    assert not app.exception, app.exception
    texts = [t.value for t in app.text]
    assert f"snapkv — {SUMMARY}" in texts and MODULE_DOC in texts  # the literal text, as written
    rendered = MarkdownIt("commonmark").enable("table")
    for element in [*app.markdown, *app.caption, *app.info, *app.error]:
        html = rendered.render(str(element.value))
        assert "tracker.example" not in html and "<img" not in html, element.value
        assert "Certified by kvbench" not in html, element.value


def test_a_file_scorer_is_shown_by_its_file_name(
    submission: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Policy tab names the file a scorer came from, not the module name kvbench imported it under."""
    db = tmp_path / "board.duckdb"
    cli("accept", str(submission / "bundle.kvbench.tar.gz"), "--db", str(db), cwd=tmp_path)
    monkeypatch.setenv(DATABASE_ENV, str(tmp_path / "board.snapshot.duckdb"))
    app = AppTest.from_file(APP, default_timeout=120).run()
    app.selectbox(key="policy").set_value("keys-norm").run()
    assert not app.exception, app.exception
    (source,) = [t.value for t in app.text if t.value.startswith("source: ")]
    assert source.startswith("source: keys_norm.py (scorer file) (as stored with its newest run)"), source
    assert "kvbench_user_policy" not in source
