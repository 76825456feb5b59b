"""The archive checks of `open_bundle`, on hand-made archives: each unsafe member is named with its rule
and nothing at all is extracted."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from kvbench.submissions import bundle
from kvbench.submissions.bundle import open_bundle
from kvbench.submissions.rules import check_bundle


def archive(path: Path, members: dict[str, bytes], *, hardlink: str | None = None) -> Path:
    with tarfile.open(path, "w:gz") as out:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
        if hardlink is not None:
            info = tarfile.TarInfo(hardlink)
            info.type = tarfile.LNKTYPE
            info.linkname = "bundle.json"
            out.addfile(info)
    return path


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("/etc/cron.d/evil", "member-path"),
        ("runs/../../evil", "member-path"),
        ("notes.txt", "member-name"),
        ("scorers/a b.py", "member-name"),
        ("runs/0123456789abcdef/x.parquet", "member-name"),
    ],
)
def test_an_unsafe_or_unexpected_member_is_refused_and_nothing_extracted(
    tmp_path: Path, name: str, rule: str
) -> None:
    into = tmp_path / "into"
    into.mkdir()
    path = archive(tmp_path / "b.tar.gz", {"bundle.json": b"{}", name: b"x"})
    assert [(f.member, f.rule) for f in open_bundle(path, into)] == [(name, rule)]
    assert list(into.iterdir()) == []


def test_hard_links_and_oversized_members_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = archive(tmp_path / "b.tar.gz", {"bundle.json": b"{}"}, hardlink="suites/a.yaml")
    assert [(f.member, f.rule) for f in open_bundle(path, tmp_path)] == [("suites/a.yaml", "member-link")]
    monkeypatch.setattr(bundle, "MAX_MEMBER_BYTES", 100)
    path = archive(tmp_path / "c.tar.gz", {"bundle.json": b"{}", "environment.json": b"0" * 101})
    assert [(f.member, f.rule) for f in open_bundle(path, tmp_path)] == [("environment.json", "member-size")]
    monkeypatch.setattr(bundle, "MAX_TOTAL_BYTES", 150)
    path = archive(tmp_path / "d.tar.gz", {"bundle.json": b"0" * 80, "environment.json": b"0" * 80})
    assert [f.rule for f in open_bundle(path, tmp_path)] == ["member-size"]


def test_directories_duplicates_and_huge_extended_headers_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "b.tar.gz"
    with tarfile.open(path, "w:gz") as out:
        for name in ("bundle.json", "bundle.json"):
            info = tarfile.TarInfo(name)
            out.addfile(info, io.BytesIO(b""))
        folder = tarfile.TarInfo("runs")
        folder.type = tarfile.DIRTYPE
        out.addfile(folder)
    found = {(f.member, f.rule) for f in open_bundle(path, tmp_path / "x")}
    assert found == {("bundle.json", "member-duplicate"), ("runs", "member-type")}
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as out:
        info = tarfile.TarInfo("bundle.json")
        info.pax_headers = {"comment": "x" * 10_000}  # parsed quadratically by CPython before 3.11.10
        out.addfile(info, io.BytesIO(b""))
    assert [f.rule for f in open_bundle(path, tmp_path / "x")] == ["member-header"]


def test_a_file_that_is_not_an_archive_is_named(tmp_path: Path) -> None:
    path = tmp_path / "b.tar.gz"
    path.write_bytes(b"not a tar")
    assert [f.rule for f in open_bundle(path, tmp_path)] == ["archive"]


def test_a_malformed_bundle_manifest_is_one_failure(tmp_path: Path) -> None:
    (tmp_path / "bundle.json").write_text('{"cells": "everything"}')
    failures = check_bundle(tmp_path).failures
    assert [(f.member, f.rule) for f in failures] == [("bundle.json", "bundle-manifest")]
