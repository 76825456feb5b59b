"""The submission bundle: one gzip'd tar that carries runs from one machine to a public leaderboard.

    bundle.json                        what is in it: cells, their output digests, every member's sha256
    environment.json                   where it ran: packages, hardware, adapters
    runs/<run_id>/manifest.json        each run's manifest (resolved spec and provenance), as written
    runs/<run_id>/<problem>.parquet    its samples, one shard per problem, as written
    suites/<name>.yaml                 the suite each run was planned from
    protocols/<name>.yaml              the protocol of the runs, as resolved
    scorers/<policy>.py                the source of each policy that is not built into kvbench

A bundle is read only through :func:`open_bundle`, which refuses an unsafe archive before it extracts
anything: absolute or ``..`` paths, links, devices, oversized or unexpected members, and extended
headers large enough to stall Python's tar parser (CPython's pax parsing is quadratic before 3.11.10).
It reads ``bundle.json`` first, from memory, and writes nothing unless that is a bundle manifest listing
every other member, and the members fit the caps and the disk.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import tarfile
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pydantic

from kvbench.specs.resolved import Role
from kvbench.store.atomic import atomic_write
from kvbench.submissions.text import bundle_field, json_problems

FORMAT = "kvbench-bundle"
FORMAT_VERSION = 1
MANIFEST = "bundle.json"
ENVIRONMENT = "environment.json"
MAX_MEMBER_BYTES = 64 * 2**20
"""The largest member accepted: a shard holds one problem's samples, far below this."""
MAX_TOTAL_BYTES = 2 * 2**30
MAX_MEMBERS = 100_000
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
MEMBER_NAMES = re.compile(
    rf"^(?:{re.escape(MANIFEST)}|{re.escape(ENVIRONMENT)}"
    r"|runs/[0-9a-f]{16}/(?:manifest\.json|[0-9a-f]{16}\.parquet)"
    rf"|suites/{_NAME}\.yaml|protocols/{_NAME}\.yaml|scorers/{_NAME}\.py)"
)
"""Every name a bundle may hold (matched whole, with ``fullmatch``)."""
NAME = re.compile(_NAME)
"""What a suite, protocol or policy name must look like to name a member."""
MAX_HEADER_BYTES = 4096
"""The largest pax or GNU long-name header accepted: the names in a bundle are short."""
_BLOCK = 512


class Member(pydantic.BaseModel):
    sha256: str
    size: int


class BundleCell(pydantic.BaseModel):
    """One run as bundle.json lists it."""

    model_config = pydantic.ConfigDict(extra="forbid")

    run_id: str
    role: Role
    label: str | None
    output_digest: str
    samples: int
    suite: str
    protocol: str
    scorer: str | None


class BundleManifest(pydantic.BaseModel):
    """bundle.json: what a bundle holds, and the digests that bind it."""

    model_config = pydantic.ConfigDict(extra="forbid")

    format: str
    format_version: int
    schema_version: int
    kvbench: str
    created: float
    submitter: str
    description: str
    cells: list[BundleCell]
    members: dict[str, Member]


@dataclass(frozen=True)
class Failure:
    """One broken rule: the member (or cell) it concerns, the rule's name, and what is wrong."""

    member: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.member}: [{self.rule}] {self.message}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _member_failure(member: tarfile.TarInfo) -> Failure | None:
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith("/") or ".." in parts or "\\" in name:
        return Failure(name, "member-path", "an absolute path or a '..' step would write outside the bundle")
    if member.issym() or member.islnk():
        return Failure(
            name, "member-link", f"a link (to {member.linkname!r}); a bundle holds plain files only"
        )
    if not member.isfile():
        return Failure(name, "member-type", "not a plain file (a directory, device or fifo)")
    if member.size > MAX_MEMBER_BYTES:
        return Failure(
            name, "member-size", f"{member.size:,} bytes, over the {MAX_MEMBER_BYTES:,}-byte limit"
        )
    if not MEMBER_NAMES.fullmatch(name):
        return Failure(
            name, "member-name", "not a member a kvbench bundle has (see kvbench.submissions.bundle)"
        )
    return None


def _octal(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # base-256: a size no bundle member has
        return MAX_TOTAL_BYTES + 1
    text = field.rstrip(b"\0 ").strip()
    return int(text, 8) if text else 0


def _prescan(path: Path) -> Failure | None:
    """Walk the decompressed stream's 512-byte headers before tarfile parses them: refuse a huge
    extended header, and stop once the members cross the count or size limits (a compression bomb)."""
    count = total = 0
    with gzip.open(path, "rb") as stream:
        while header := stream.read(_BLOCK):
            if len(header) < _BLOCK or header == bytes(_BLOCK):
                return None
            size, kind = _octal(header[124:136]), header[156:157]
            if kind in (b"x", b"g", b"L", b"K") and size > MAX_HEADER_BYTES:
                return Failure(path.name, "member-header", f"an extended header of {size:,} bytes")
            count, total = count + 1, total + size
            if count > MAX_MEMBERS or total > MAX_TOTAL_BYTES:
                return Failure(
                    path.name,
                    "member-size",
                    f"over {MAX_MEMBERS:,} members or {MAX_TOTAL_BYTES:,} bytes in all",
                )
            left = -(-size // _BLOCK) * _BLOCK
            while left > 0:
                skipped = len(stream.read(min(left, 1 << 20)))
                if not skipped:
                    return None  # truncated: tarfile says how
                left -= skipped
    return None


_DAMAGED = (OSError, EOFError, tarfile.TarError, zlib.error)


def open_bundle(path: Path, into: Path) -> list[Failure]:
    """Check the archive's headers, then every member's, then extract the plain files into ``into``;
    the failures, if any (then nothing is extracted)."""
    try:
        early = _prescan(path)
        if early is not None:
            return [early]
        with tarfile.open(path, "r:gz") as archive:
            members = archive.getmembers()
            failures = [f for f in map(_member_failure, members) if f is not None]
            counts = Counter(m.name for m in members)
            failures += [
                Failure(n, "member-duplicate", "appears twice") for n, c in sorted(counts.items()) if c > 1
            ]
            if failures:
                return failures
            failures = _listed(path, archive, members, into)
            if failures:
                return failures
            for member in members:
                target = into / member.name
                target.parent.mkdir(parents=True, exist_ok=True)
                source = archive.extractfile(member)
                assert source is not None  # a plain file, checked above
                with source, open(target, "wb") as handle:
                    shutil.copyfileobj(source, handle)
    except _DAMAGED as exc:
        for leftover in into.iterdir() if into.is_dir() else ():
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        return [Failure(path.name, "archive", f"not a readable gzip'd tar archive ({exc})")]
    return []


def _listed(
    path: Path, archive: tarfile.TarFile, members: list[tarfile.TarInfo], into: Path
) -> list[Failure]:
    """Before anything is written: ``bundle.json``, read into memory, must be a bundle manifest that lists
    every other member, and what they hold together must fit on the disk under ``into``. (The headers
    already passed the per-member and total caps; the rules then check each member's size and sha256
    against the listing.)"""
    by_name = {m.name: m for m in members}
    if MANIFEST not in by_name:
        return [Failure(MANIFEST, "bundle-manifest", "missing: a bundle lists its members in bundle.json")]
    source = archive.extractfile(by_name[MANIFEST])
    assert source is not None  # a plain file, checked above
    with source:
        raw = source.read()
    try:
        listing = BundleManifest.model_validate_json(raw).members
    except pydantic.ValidationError as exc:
        malformed = _malformed_text(raw)
        if malformed:
            return malformed
        why = str(exc).splitlines()[0]
        return [Failure(MANIFEST, "bundle-manifest", f"not a bundle manifest ({why}); nothing was extracted")]
    failures = [
        Failure(m.name, "digest", "not listed in the bundle manifest's members; nothing was extracted")
        for m in members
        if m.name != MANIFEST and m.name not in listing
    ]
    total = sum(m.size for m in members)
    existing = next(p for p in (into, *into.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if not failures and total > free:
        failures.append(
            Failure(path.name, "member-size", f"{total:,} bytes to extract, {free:,} free under {existing}")
        )
    return failures


def _malformed_text(raw: bytes) -> list[Failure]:
    """The text rule's failures in a bundle.json that pydantic refused: its JSON parser refuses a lone
    surrogate (``"\\ud800"``) as invalid JSON without naming the field, Python's names it."""
    try:
        listing = json.loads(raw)
    except ValueError:
        return []
    found = list(json_problems(listing, bundle_field))[:20]
    return [
        Failure(MANIFEST, "text", f"{where} {problem}; nothing was extracted") for where, problem in found
    ]


def write_bundle(path: Path, members: dict[str, Path]) -> None:
    """A gzip'd tar of ``members`` (archive name -> file), sorted, with neutral owners and times, so that
    the same members always give the same bytes (gzip's header names no file: it would name the random
    temporary file the bundle is written through)."""

    def pack(temp: Path) -> None:
        with (
            open(temp, "wb") as raw,
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=6, mtime=0) as packed,
            tarfile.open(fileobj=packed, mode="w") as archive,
        ):
            for name in sorted(members):
                info = archive.gettarinfo(str(members[name]), arcname=name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                info.mode = 0o644
                with open(members[name], "rb") as handle:
                    archive.addfile(info, handle)

    atomic_write(path, pack)
