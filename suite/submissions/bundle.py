"""The submission bundle: one gzip'd tar that carries runs from one machine to a public leaderboard.

    bundle.json                        what is in it: cells, their output digests, every member's sha256
    environment.json                   where it ran: packages, hardware, adapters
    runs/<run_id>/manifest.json        each run's manifest (resolved spec and provenance), as written
    runs/<run_id>/<problem>.parquet    its samples, one shard per problem, as written
    suites/<name>.yaml                 the suite each run was planned from
    protocols/<name>.yaml              the protocol of the runs, as resolved
    scorers/<policy>.py                the source of each policy that is not built into kvbench

A bundle is read only through :func:`open_bundle`, which refuses an unsafe archive before it extracts
anything: absolute or ``..`` paths, links, devices, sparse, oversized or unexpected members, and
extended headers (pax, GNU long names) over MAX_HEADER_BYTES, refused before tarfile reads them (CPython's
pax parsing is quadratic before 3.11.10, and a long name is read whole into memory). Every bound is
checked on the sizes tarfile itself decoded, one header at a time, so no second parser can disagree
with it. It reads ``bundle.json`` first, from memory, and writes nothing unless that is a bundle manifest
listing every other member, and the members fit the caps and the disk.
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
MAX_TEXT_MEMBER_BYTES = {".yaml": 64 * 2**10, ".py": 2**20, ".json": 4 * 2**20}
"""The largest member of each text kind, which accept parses whole (a suite's or protocol's YAML, parsed by
a pure-Python loader at some 30 KB a second: 4 MiB took 2.5 minutes and 1.3 GB; a scorer; a manifest). The
built-in suites and protocols are under 4 KiB, a manifest under 100 KiB."""
MAX_TOTAL_BYTES = 2 * 2**30
"""The most bytes all members may announce together (what extraction writes to the disk)."""
MAX_MEMBERS = 100_000
"""The most members a bundle may hold: a shard per (run, problem), far below this."""
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
    created: float = pydantic.Field(allow_inf_nan=False, ge=0, le=1e11)
    """When it was exported, seconds since 1970: a finite time before the year 5138."""
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
    if not 0 <= member.size <= MAX_MEMBER_BYTES:
        return Failure(
            name, "member-size", f"{member.size:,} bytes, over the {MAX_MEMBER_BYTES:,}-byte limit"
        )
    if not MEMBER_NAMES.fullmatch(name):
        return Failure(
            name, "member-name", "not a member a kvbench bundle has (see kvbench.submissions.bundle)"
        )
    bound = MAX_TEXT_MEMBER_BYTES.get(PurePosixPath(name).suffix)
    if bound is not None and member.size > bound:
        return Failure(
            name,
            "member-size",
            f"{member.size:,} bytes, over the {bound:,} bytes a {PurePosixPath(name).suffix} member may have",
        )
    return None


class _OverBoundError(Exception):
    """A header over its bound, raised from inside tarfile's own parsing so that nothing it announces is
    read (not a tarfile.HeaderError: tarfile would turn that into a ReadError, or skip it)."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(str(failure))
        self.failure = failure


_EXTENDED = {
    tarfile.XHDTYPE: "pax",
    tarfile.XGLTYPE: "pax global",
    tarfile.SOLARIS_XHDTYPE: "Solaris pax",
    tarfile.GNUTYPE_LONGNAME: "GNU long-name",
    tarfile.GNUTYPE_LONGLINK: "GNU long-link",
}


class _BoundedInfo(tarfile.TarInfo):
    """tarfile's header parsing, with a bound checked on each header's size as tarfile itself decoded it
    (octal, base-256 or negative), before tarfile reads what the header announces. Checking tarfile's own
    reading, not a walk of the headers beside it, leaves no second parser to disagree with the first: a
    pax ``size`` record, a global header or a base-256 field means the same to the check as to the read.
    ``_proc_member`` is tarfile's documented hook for subclasses."""

    def _proc_member(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        kind = _EXTENDED.get(self.type)
        if kind is not None and not 0 <= self.size <= MAX_HEADER_BYTES:
            raise _OverBoundError(
                Failure(
                    self.name or "(unnamed)",
                    "member-header",
                    f"a {kind} header of {self.size:,} bytes, over the {MAX_HEADER_BYTES:,}-byte bound",
                )
            )
        if self.type == tarfile.GNUTYPE_SPARSE:
            # its map of holes may run on for as many blocks as the stream has, each one parsed
            raise _OverBoundError(
                Failure(self.name, "member-type", "a sparse member; a bundle holds plain files")
            )
        return super()._proc_member(archive)  # type: ignore[misc]

    def _refuse_sparse(self, *_: object) -> None:
        raise _OverBoundError(
            Failure(self.name, "member-type", "a sparse member; a bundle holds plain files")
        )

    # the pax forms of a sparse member: version 1.0 reads its map from the member's data, unbounded
    _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _refuse_sparse


def _walk(path: Path, archive: tarfile.TarFile) -> tuple[list[tarfile.TarInfo], list[Failure]]:
    """Every member, read one header at a time by tarfile itself; each is checked before the next is
    read, so that the walk stops at the first member whose size, or the members' count or total, is over
    its bound (skipping past an oversized member would decompress what it announces)."""
    members: list[tarfile.TarInfo] = []
    failures: list[Failure] = []
    total = 0
    while (member := archive.next()) is not None:
        members.append(member)
        total += max(member.size, 0)
        failure = _member_failure(member)
        if failure is not None:
            failures.append(failure)
            if failure.rule == "member-size":
                break
        if len(members) > MAX_MEMBERS or total > MAX_TOTAL_BYTES:
            why = (
                f"over {MAX_MEMBERS:,} members or {MAX_TOTAL_BYTES:,} bytes in all "
                f"({total:,} bytes by member {len(members):,})"
            )
            failures.append(Failure(path.name, "member-size", why))
            break
    return members, failures


_DAMAGED = (OSError, EOFError, tarfile.TarError, zlib.error)


def open_bundle(path: Path, into: Path) -> list[Failure]:
    """Check the archive's headers, then every member's, then extract the plain files into ``into``;
    the failures, if any (then nothing is extracted)."""
    try:
        with tarfile.open(path, "r:gz", tarinfo=_BoundedInfo) as archive:
            members, failures = _walk(path, archive)
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
    except _OverBoundError as over:
        return [over.failure]
    except RecursionError:  # tarfile reads a chain of extended headers by recursion, one frame per header
        return [Failure(path.name, "member-header", "extended headers chained hundreds deep")]
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
        fields = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'the whole'}: {e['msg']}" for e in exc.errors()[:5]
        )  # where and what, never the value: it is the submitter's text
        why = f"{exc.error_count()} field(s) wrong: {fields}"
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
    except (ValueError, RecursionError):
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
