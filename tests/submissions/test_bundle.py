"""The archive checks of `open_bundle`, on hand-made archives: each unsafe member is named with its rule
and nothing at all is extracted."""

from __future__ import annotations

import io
import json
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


def _zeros(path: Path, members: dict[str, int], manifest: bytes) -> Path:
    """A compression bomb: members of zeros (a few kB each once compressed), then ``manifest`` as
    bundle.json, last, as a forger would place it."""
    with tarfile.open(path, "w:gz", compresslevel=1) as out:
        for name, size in members.items():
            info = tarfile.TarInfo(name)
            info.size = size
            out.addfile(info, io.BytesIO(bytes(size)))
        info = tarfile.TarInfo("bundle.json")
        info.size = len(manifest)
        out.addfile(info, io.BytesIO(manifest))
    return path


BOMB = {f"runs/{i:016x}/{i:016x}.parquet": 16 * 2**20 for i in range(4)}
"""64 MiB of members, each under the per-member cap, in a bundle of about 260 kB."""


@pytest.mark.parametrize(
    ("manifest", "why"),
    [
        (b"{}", "not a bundle manifest"),
        (b"\x00" * 64, "not a bundle manifest"),
        (None, "missing"),
    ],
    ids=["an empty object", "binary", "absent"],
)
def test_nothing_is_written_before_bundle_json_is_checked(
    tmp_path: Path, manifest: bytes | None, why: str
) -> None:
    path = _zeros(tmp_path / "bomb.tar.gz", BOMB, manifest or b"")
    if manifest is None:  # the same bomb without a bundle.json at all
        with tarfile.open(path, "r:gz") as source, tarfile.open(tmp_path / "b.tar.gz", "w:gz") as out:
            for member in source.getmembers():
                if member.name != "bundle.json":
                    out.addfile(member, source.extractfile(member))
        path = tmp_path / "b.tar.gz"
    assert path.stat().st_size < 2**20
    into = tmp_path / "into"
    into.mkdir()
    failures = open_bundle(path, into)
    assert [(f.member, f.rule) for f in failures] == [("bundle.json", "bundle-manifest")]
    assert why in failures[0].message
    assert list(into.rglob("*")) == []


def test_a_member_bundle_json_does_not_list_is_refused_before_writing(tmp_path: Path) -> None:
    listed = {name: {"sha256": "0" * 64, "size": size} for name, size in list(BOMB.items())[:1]}
    manifest = {
        "format": "kvbench-bundle", "format_version": 1, "schema_version": 1, "kvbench": "0", "created": 0,
        "submitter": "", "description": "", "cells": [], "members": listed,
    }  # fmt: skip
    path = _zeros(tmp_path / "bomb.tar.gz", BOMB, json.dumps(manifest).encode())
    into = tmp_path / "into"
    into.mkdir()
    failures = open_bundle(path, into)
    assert sorted((f.member, f.rule) for f in failures) == [(name, "digest") for name in sorted(BOMB)[1:]]
    assert list(into.rglob("*")) == []


def test_the_same_members_give_the_same_bundle_bytes_wherever_it_is_written(tmp_path: Path) -> None:
    """Two exports of one run are one file: gzip's header must not carry the (random) name of the
    temporary file the bundle was written through, nor a time."""
    member = tmp_path / "bundle.json"
    member.write_text('{"cells": []}')
    first, second = tmp_path / "a" / "one.tar.gz", tmp_path / "b" / "other-name.tar.gz"
    for path in (first, second):
        path.parent.mkdir()
        bundle.write_bundle(path, {"bundle.json": member})
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes()[3] == 0  # gzip's FLG byte: no file name, no comment, no extra field
