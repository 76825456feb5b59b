"""The submission bundle: one gzip'd tar that carries runs from one machine to a public leaderboard.

    bundle.json                        what is in it: cells, their output digests, every member's sha256
    environment.json                   where it ran: packages, hardware, adapters
    runs/<run_id>/manifest.json        each run's manifest (resolved spec and provenance), as written
    runs/<run_id>/<problem>.parquet    its samples, one shard per problem, as written
    suites/<name>.yaml                 the suite each run was planned from
    protocols/<name>.yaml              the protocol of the runs, as resolved
    scorers/<policy>.py                the source of each policy that is not built into kvbench

A bundle is read only through :func:`open_bundle`, which refuses unsafe archives before any byte lands
on disk: absolute or ``..`` paths, links, devices, oversized or unexpected members.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

import pydantic

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
    rf"|suites/{_NAME}\.yaml|protocols/{_NAME}\.yaml|scorers/{_NAME}\.py)$"
)


class Member(pydantic.BaseModel):
    sha256: str
    size: int


class BundleCell(pydantic.BaseModel):
    """One run as bundle.json lists it."""

    model_config = pydantic.ConfigDict(extra="forbid")

    run_id: str
    role: Literal["policy", "null", "reference"]
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


class ResolvedShape(pydantic.BaseModel):
    """The top-level fields of a run's resolved spec that the rules read (its parts are validated by
    the spec models themselves)."""

    runner_version: int
    runtime: dict[str, str]
    model: dict
    task: dict
    policy: dict
    protocol: dict
    budget: int | None
    ratio: float | None
    samples: int
    limit: int | None


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
    if not MEMBER_NAMES.match(name):
        return Failure(
            name, "member-name", "not a member a kvbench bundle has (see kvbench.submissions.bundle)"
        )
    return None


def open_bundle(path: Path, into: Path) -> list[Failure]:
    """Check every member's header, then extract the plain files into ``into``; the failures, if any
    (then nothing is extracted)."""
    try:
        archive = tarfile.open(path, "r:*")  # noqa: SIM115  (closed by the `with` below, once it opened)
    except (OSError, tarfile.TarError) as exc:
        return [Failure(path.name, "archive", f"not a readable tar archive ({exc})")]
    with archive:
        members: list[tarfile.TarInfo] = []
        total = 0
        try:
            # header by header, so that an archive that unpacks to far more than the limits (a
            # compression bomb) is refused once it crosses them, not after it was all decompressed
            for member in archive:
                members.append(member)
                total += member.size
                if len(members) > MAX_MEMBERS or total > MAX_TOTAL_BYTES:
                    return [
                        Failure(
                            path.name,
                            "member-size",
                            f"over {MAX_MEMBERS:,} members or {MAX_TOTAL_BYTES:,} bytes in all",
                        )
                    ]
        except (OSError, tarfile.TarError, EOFError) as exc:
            return [Failure(path.name, "archive", f"the archive is damaged ({exc})")]
        failures = [f for f in map(_member_failure, members) if f is not None]
        names = [m.name for m in members]
        failures += [
            Failure(n, "member-duplicate", "appears twice") for n in sorted(set(names)) if names.count(n) > 1
        ]
        if failures:
            return failures
        for member in members:
            target = into / member.name
            target.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(member)
            assert source is not None  # a plain file, checked above
            with source, open(target, "wb") as handle:
                handle.write(source.read())
    return []


def write_bundle(path: Path, members: dict[str, Path]) -> None:
    """A gzip'd tar of ``members`` (archive name -> file), sorted, with neutral owners and times, so that
    the same members always give the same bytes."""
    temp = path.with_name(f".{path.name}.tmp")
    with (
        open(temp, "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as packed,
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
    temp.replace(path)
