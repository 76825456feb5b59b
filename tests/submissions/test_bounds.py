"""Every byte of a bundle is read within bounds stated in advance: each hostile bundle just over a bound
is refused through `kvbench accept` with the bound named, before the memory it announces is taken; the
genuine bundle is accepted."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hostile_archives import desynchronised, sparse
from submitting import cli, run_of
from tampering import edit_samples, forged

from kvbench.submissions import tables
from kvbench.submissions.bundle import MAX_HEADER_BYTES, open_bundle


def _accept(bundle: Path, tmp_path: Path) -> tuple[int, str]:
    done = cli("accept", str(bundle), "--db", str(tmp_path / "board.duckdb"), cwd=tmp_path, check=False)
    return done.returncode, done.stdout + done.stderr


def test_the_genuine_bundle_is_within_every_bound(submission: Path, tmp_path: Path) -> None:
    code, said = _accept(submission / "bundle.kvbench.tar.gz", tmp_path)
    assert code == 0 and "accepted" in said, said


def test_a_long_name_hidden_behind_a_pax_size_record_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """The desynchronisation the pre-scan fell to: it skipped 1 GiB of a member the pax record says is
    empty, so it never saw the long-name header tarfile then read whole into memory."""
    code, said = _accept(desynchronised(tmp_path / "b.tar.gz", b"a" * (MAX_HEADER_BYTES + 1)), tmp_path)
    assert code == 1, said
    assert "[member-header] a GNU long-name header of 4,097 bytes, over the 4,096-byte bound" in said, said


def test_a_long_name_at_its_bound_is_read(tmp_path: Path) -> None:
    path = desynchronised(tmp_path / "b.tar.gz", b"bundle.json", filler=MAX_HEADER_BYTES - len("bundle.json"))
    assert "member-header" not in {f.rule for f in open_bundle(path, tmp_path / "into")}


def test_a_sparse_member_is_refused(tmp_path: Path) -> None:
    code, said = _accept(sparse(tmp_path / "b.tar.gz", "environment.json"), tmp_path)
    assert code == 1 and "environment.json: [member-type] a sparse member" in said, said


def _shard_of(folder: Path, run_id: str) -> Path:
    return sorted((folder / "runs" / run_id).glob("*.parquet"))[0]


def test_a_shard_over_the_row_bound_is_refused(submission: Path, tmp_path: Path) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    run_id = run_of(bundle, "passkey", "keys-norm")

    def more_rows(folder: Path) -> None:
        shard = _shard_of(folder, run_id)
        table = pq.read_table(shard)
        pq.write_table(table.take([0] * (tables.MAX_SHARD_ROWS + 1)), shard)

    code, said = _accept(forged(bundle, tmp_path / "f.tar.gz", more_rows), tmp_path)
    assert code == 1, said
    assert "[row-count] 10,001 (its footer says) rows, over the bound of 10,000 (MAX_SHARD_ROWS)" in said


def test_a_shard_that_decodes_past_its_bound_is_refused_before_it_is_decoded_whole(
    submission: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A string a hundred times the shard's size once compressed, stored once but decoded on every row, so
    that only the decoding, not the footer, crosses the bound; the bound lowered to 4 MiB to keep the
        test small (the bound is read where it is checked, so the real one is checked the same way)."""
    monkeypatch.setattr(tables, "MAX_SHARD_DECODED_BYTES", 4 * 2**20)
    bundle = submission / "bundle.kvbench.tar.gz"
    run_id = run_of(bundle, "passkey", "keys-norm")

    def long_output(folder: Path) -> None:
        shard = _shard_of(folder, run_id)
        table = pq.read_table(shard)
        # one string in the dictionary, on every row: the footer's sizes count it once
        rows = [{**table.to_pylist()[0], "output": "x" * 2**20}] * 8
        pq.write_table(table.from_pylist(rows, schema=table.schema), shard, compression="zstd")
        assert shard.stat().st_size * 100 < 8 * 2**20
        assert pq.ParquetFile(shard).metadata.row_group(0).total_byte_size < 4 * 2**20

    code, said = _accept(forged(bundle, tmp_path / "f.tar.gz", long_output), tmp_path)
    assert code == 1, said
    assert "[table-size] decodes to at least 8," in said, said
    assert "over the bound of 4,194,304 bytes (MAX_SHARD_DECODED_BYTES)" in said, said


@pytest.mark.parametrize(
    ("column", "value", "named"),
    [
        ("metric", 1.5, "metric that is not finite and in [0, 1] (a share)"),
        ("wall_seconds", math.inf, "wall_seconds that is not finite"),
        ("needle_survival", -0.25, "needle_survival that is not finite and in [0, 1] (a share)"),
    ],
)
def test_a_number_out_of_its_range_is_refused(
    submission: Path, tmp_path: Path, column: str, value: float, named: str
) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    run_id = run_of(bundle, "passkey", "keys-norm")

    def out_of_range(folder: Path) -> None:
        edit_samples(folder, run_id, lambda row: row.update({column: value}))

    code, said = _accept(forged(bundle, tmp_path / "f.tar.gz", out_of_range, output_digests=True), tmp_path)
    assert code == 1, said
    assert f"runs/{run_id}: [value-range]" in said and named in said, said


def test_a_protocol_yaml_over_its_bound_is_refused_before_it_is_parsed(
    submission: Path, tmp_path: Path
) -> None:
    """A 4 MiB protocol of one long list (15 kB compressed) took 2.5 minutes and 1.3 GB to be refused by
    the protocol rule, which parses it; the member bound refuses it unread."""
    import time

    def long_protocol(folder: Path) -> None:
        (protocol,) = (folder / "protocols").glob("*.yaml")
        protocol.write_text("[" + "1, " * (4 * 2**20 // 3) + "1]")

    bundle = forged(submission / "bundle.kvbench.tar.gz", tmp_path / "f.tar.gz", long_protocol)
    started = time.monotonic()
    code, said = _accept(bundle, tmp_path)
    assert code == 1, said
    assert "[member-size] 4,194,306 bytes, over the 65,536 bytes a .yaml member may have" in said, said
    assert time.monotonic() - started < 60


def test_a_manifest_nested_past_the_json_readers_depth_is_refused_with_its_rule(
    submission: Path, tmp_path: Path
) -> None:
    """A list 5,000 deep in a policy parameter ended accept in a RecursionError traceback."""
    bundle = submission / "bundle.kvbench.tar.gz"
    run_id = run_of(bundle, "passkey", "keys-norm")

    def deep(folder: Path) -> None:
        manifest = folder / "runs" / run_id / "manifest.json"
        text = manifest.read_text()
        manifest.write_text(
            text.replace('"spec": {', '"deep": ' + "[" * 5000 + "]" * 5000 + ', "spec": {', 1)
        )

    code, said = _accept(forged(bundle, tmp_path / "f.tar.gz", deep), tmp_path)
    assert code == 1 and "Traceback" not in said, said
    assert f"runs/{run_id}/manifest.json" in said and "nested too deeply" in said, said


def test_a_refusal_of_many_members_lists_the_first_fifty_and_counts_the_rest(
    submission: Path, tmp_path: Path
) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    run_id = run_of(bundle, "passkey", "keys-norm")

    def empty_shards(folder: Path) -> None:
        for index in range(300):
            (folder / "runs" / run_id / f"{index:016x}.parquet").write_bytes(b"")

    code, said = _accept(forged(bundle, tmp_path / "f.tar.gz", empty_shards), tmp_path)
    assert code == 1, said
    listed = [line for line in said.splitlines() if line.startswith("  ") and "[" in line]
    assert len(listed) == 50, said[-2000:]
    assert re.search(r"  … and [\d,]+ more", said), said[-500:]


@pytest.mark.parametrize("created", [math.nan, 1e308, -1.0])
def test_a_creation_time_that_is_no_time_is_refused(submission: Path, tmp_path: Path, created: float) -> None:
    import json

    def when(folder: Path) -> None:
        manifest = json.loads((folder / "bundle.json").read_text())
        (folder / "bundle.json").write_text(json.dumps(manifest | {"created": created}))

    code, said = _accept(forged(submission / "bundle.kvbench.tar.gz", tmp_path / "f.tar.gz", when), tmp_path)
    assert code == 1 and "bundle.json" in said and "created" in said, said


@pytest.mark.parametrize(
    ("task", "arm", "said"),
    [
        # one sample: its footer's value count is past the bound, refused before a value is decoded
        (
            "passkey",
            "keys-norm",
            "column head_coverage.list.element holds 65,537 values in 1 row(s) (its footer",
        ),
        # four samples: the footer's count is within four samples' bound, the one long list is caught as
        # its batch decodes
        ("gpqa-diamond", "snapkv", "a list of 65,537 values in one sample, over the bound of 65,536"),
    ],
    ids=["by the footer", "as decoded"],
)
def test_a_list_past_its_bound_in_one_sample_is_refused(
    submission: Path, tmp_path: Path, task: str, arm: str, said: str
) -> None:
    """A run-length encoded list of zeros is a few bytes in the file and four bytes a value decoded (250
    million of them took 2.9 GB before this bound)."""
    bundle = submission / "bundle.kvbench.tar.gz"
    run_id = run_of(bundle, task, arm)

    def long_list(folder: Path) -> None:
        shard = _shard_of(folder, run_id)
        rows = pq.read_table(shard).to_pylist()
        rows[0]["head_coverage"] = [0.0] * (tables.MAX_LIST_VALUES + 1)
        pq.write_table(pq.read_table(shard).from_pylist(rows, schema=pq.read_schema(shard)), shard)

    code, out = _accept(forged(bundle, tmp_path / "f.tar.gz", long_list, output_digests=True), tmp_path)
    assert code == 1, out
    assert said in out and "(MAX_LIST_VALUES)" in out, out


def test_a_shard_of_an_older_sample_schema_is_refused(submission: Path, tmp_path: Path) -> None:
    """A bundle comes from this kvbench's runner, in its sample schema: an older shard's upgrade turned
    every row into Python objects, about 19 times its decoded size, on the submitter's bytes."""
    bundle = submission / "bundle.kvbench.tar.gz"
    run_id = run_of(bundle, "passkey", "keys-norm")

    def older(folder: Path) -> None:
        shard = _shard_of(folder, run_id)
        pq.write_table(pq.read_table(shard).drop_columns(["no_answer"]), shard)

    code, out = _accept(forged(bundle, tmp_path / "f.tar.gz", older), tmp_path)
    assert code == 1, out
    assert "[sample-counts] lacks the columns no_answer of the sample schema this kvbench stores" in out, out
