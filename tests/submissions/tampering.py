"""Forging a bundle as a dishonest submitter would: unpack it, edit it, and (optionally) recompute the
digests the bundle lists, so that only the rules that look deeper can catch the edit."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from kvbench.results.check import outputs_digest


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def forged(
    source: Path,
    target: Path,
    edit: Callable[[Path], None],
    *,
    member_digests: bool = True,
    output_digests: bool = False,
    extra: Callable[[tarfile.TarFile], None] | None = None,
) -> Path:
    """``source`` unpacked, edited, its member digests (and cells' output digests) recomputed if asked,
    packed again into ``target``; ``extra`` may add raw members (links, ``..`` paths)."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        with tarfile.open(source) as archive:
            archive.extractall(folder, filter="data")
        edit(folder)
        manifest = json.loads((folder / "bundle.json").read_text())
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        files.remove("bundle.json")
        if member_digests:
            manifest["members"] = {
                f: {"sha256": _sha256(folder / f), "size": (folder / f).stat().st_size} for f in files
            }
        if output_digests:
            for cell in manifest["cells"]:
                shards = sorted((folder / "runs" / cell["run_id"]).glob("*.parquet"))
                con = duckdb.connect()
                con.register("rows", pa.concat_tables([pq.read_table(s) for s in shards]))
                con.execute("CREATE TABLE samples AS SELECT * FROM rows")
                cell["output_digest"] = outputs_digest(con, cell["run_id"])
        (folder / "bundle.json").write_text(json.dumps(manifest))
        with tarfile.open(target, "w:gz") as archive:
            for f in [*files, "bundle.json"]:
                archive.add(folder / f, arcname=f)
            if extra is not None:
                extra(archive)
    return target


def add_text(archive: tarfile.TarFile, name: str, text: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(text)
    archive.addfile(info, io.BytesIO(text))


def add_symlink(archive: tarfile.TarFile, name: str, to: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = to
    archive.addfile(info)


def edit_samples(folder: Path, run_id: str, change: Callable[[dict], None]) -> None:
    """Apply ``change`` to every sample row of one run, in place."""
    for shard in sorted((folder / "runs" / run_id).glob("*.parquet")):
        table = pq.read_table(shard)
        rows = table.to_pylist()
        for row in rows:
            change(row)
        pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), shard)


def reidentified(folder: Path) -> None:
    """Give every run the identity its (edited) spec hashes to, as a forger would: the folder, the
    manifest, every sample's run id and the bundle's cells follow."""
    manifest = json.loads((folder / "bundle.json").read_text())
    for cell in manifest["cells"]:
        old = cell["run_id"]
        run = json.loads((folder / "runs" / old / "manifest.json").read_text())
        text = json.dumps(run["spec"], sort_keys=True, separators=(",", ":"), default=str)
        new = hashlib.sha256(text.encode()).hexdigest()[:16]
        if new == old:
            continue
        run["run_id"] = cell["run_id"] = new
        (folder / "runs" / old / "manifest.json").write_text(json.dumps(run))
        edit_samples(folder, old, lambda row, new=new: row.update(run_id=new))
        (folder / "runs" / old).rename(folder / "runs" / new)
    (folder / "bundle.json").write_text(json.dumps(manifest))


def edit_manifest(folder: Path, run_id: str, change: Callable[[dict], None]) -> None:
    path = folder / "runs" / run_id / "manifest.json"
    run = json.loads(path.read_text())
    change(run)
    path.write_text(json.dumps(run))


def edit_cell(folder: Path, run_id: str, change: Callable[[dict], None]) -> None:
    manifest = json.loads((folder / "bundle.json").read_text())
    for cell in manifest["cells"]:
        if cell["run_id"] == run_id:
            change(cell)
    (folder / "bundle.json").write_text(json.dumps(manifest))
