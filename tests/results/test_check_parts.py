"""The parts of `kvbench check` below its rules, fast: how a cell is named and matched, how its code and
outputs are fingerprinted from real shards, and the reference file's round trip."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import duckdb
import pytest

import kvbench
from kvbench.commands.check import cell_key, code_hash, collect
from kvbench.errors import PrerequisiteError, SpecError
from kvbench.results.check import (
    FORMAT_VERSION,
    CellResult,
    ReferenceManifest,
    read_reference,
    reference_path,
    write_reference,
)
from kvbench.results.stats import bootstrap_mean
from kvbench.runner.cell import Cell
from kvbench.runner.plan import RunRequest, plan
from kvbench.store.records import SampleRecord
from kvbench.store.shards import ShardStore, problem_key

POLICY_DIR = Path(kvbench.__file__).resolve().parent.parent / "policies"


def cells(*policies: str) -> list[Cell]:
    return plan(RunRequest(models=("tiny-qwen3",), tasks=("passkey",), policies=policies))


def by_role(planned: list[Cell], role: str) -> Cell:
    return next(c for c in planned if c.role == role)


def test_a_cells_key_names_model_task_protocol_parameters_role_and_budget() -> None:
    planned = cells("snapkv")
    keys = {c.role: cell_key(c) for c in planned}
    assert keys == {
        "policy": "tiny-qwen3/passkey/protect-prompt/"
        'snapkv{"group":"mean","pool":"avg5","window":64}/policy@256',
        "null": "tiny-qwen3/passkey/protect-prompt/random{}/null@256",
        "reference": "tiny-qwen3/passkey/protect-prompt/full{}/reference@full",
    }


def test_a_parameter_or_the_budget_changes_the_key() -> None:
    plain = by_role(cells("snapkv"), "policy")
    narrow = by_role(cells("snapkv:window=32"), "policy")
    smaller = by_role(
        plan(RunRequest(models=("tiny-qwen3",), tasks=("passkey",), policies=("snapkv",), budget=192)),
        "policy",
    )
    assert len({cell_key(plain), cell_key(narrow), cell_key(smaller)}) == 3
    assert cell_key(smaller).endswith("/policy@192")


def test_the_code_hash_is_the_policy_files_sha256() -> None:
    planned = cells("snapkv", "h2o")
    for cell in planned:
        source = (
            POLICY_DIR
            / {"snapkv": "snapkv.py", "h2o": "h2o.py", "random": "random_attention.py", "full": "full.py"}[
                cell.policy.name
            ]
        )
        assert code_hash(cell) == hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    assert len({code_hash(c) for c in planned}) == len(planned)


def store(tmp_path: Path, cell: Cell, rows: dict[str, list[dict]]) -> Path:
    """Real shards for ``cell`` (problem -> row changes), loaded into a real DuckDB samples table."""
    shards = ShardStore(tmp_path, cell.run_id)
    base = {
        "metric": 0.5,
        "correct": None,
        "strict_correct": None,
        "finish_reason": "teacher-forced",
        "generated_tokens": 10,
        "evictions": 2,
        "kl_to_full": 0.25,
        "eviction_seconds": 0.1,
        "secondary": {"scored_tokens": 7},
        "output": None,
        "wall_seconds": 1.0,
    }
    for problem, samples in rows.items():
        shards.write(
            problem,
            [
                SampleRecord(
                    run_id=cell.run_id,
                    task=cell.task.name,
                    problem_id=problem,
                    problem_hash=problem_key(problem),
                    sample=i,
                    seed=100 + i,
                    **(base | changes),
                )
                for i, changes in enumerate(samples)
            ],
        )
    database = tmp_path / "store.duckdb"
    database.unlink(missing_ok=True)
    con = duckdb.connect(str(database))
    con.execute(f"CREATE TABLE samples AS SELECT * FROM read_parquet('{shards.dir}/*.parquet')")
    con.close()
    return database


def collected(tmp_path: Path, cell: Cell, rows: dict[str, list[dict]]) -> CellResult:
    (result,) = collect([cell], store(tmp_path, cell, rows))
    return result


def test_collect_scores_the_bootstrap_mean_of_problem_means(tmp_path: Path) -> None:
    cell = by_role(cells("h2o"), "policy")
    result = collected(
        tmp_path,
        cell,
        {
            "a": [{"metric": 1.0}, {"metric": 0.0}],
            "b": [{"metric": 1.0}, {"metric": 1.0}],
            "c": [{"metric": 0.0}, {"metric": 0.25}],
        },
    )
    assert result.problems == {"a": 0.5, "b": 1.0, "c": 0.125}
    expected = bootstrap_mean([0.5, 1.0, 0.125])
    assert (result.score, result.low, result.high) == (expected.value, expected.low, expected.high)
    assert result.score == pytest.approx(1.625 / 3)
    assert (result.key, result.identity, result.code) == (cell_key(cell), cell.run_id, code_hash(cell))


BASE = {"a": [{}, {}], "b": [{}]}


@pytest.mark.parametrize(
    ("change", "same"),
    [
        ({"wall_seconds": 9.0}, True),  # timings differ between any two runs
        ({"eviction_seconds": 7.0}, True),
        ({"metric": 0.5 + 3e-13}, True),  # below the rounding (12 places) that absorbs float noise
        ({"metric": 0.5 + 3e-12}, False),
        ({"metric": 0.5 + 1e-6}, False),
        ({"kl_to_full": 0.25 + 1e-6}, False),
        ({"kl_to_full": 0.25 + 3e-10}, True),  # measurements: 9 places
        ({"answer_logprob": -1.0}, False),
        ({"no_answer": True}, False),
        ({"grader_version": "math-2"}, False),
        ({"secondary": {"scored_tokens": 8}}, False),
        ({"secondary": {"scored_tokens": 7, "took_seconds": 3.0}}, True),
        ({"output": "other text"}, False),
        ({"generated_tokens": 11}, False),
        ({"evictions": 3}, False),
        ({"finish_reason": "length"}, False),
        ({"correct": True}, False),
        ({"strict_correct": False}, False),
    ],
)
def test_the_outputs_digest_moves_with_every_output_and_no_timing(
    tmp_path: Path, change: dict, same: bool
) -> None:
    cell = by_role(cells("h2o"), "policy")
    before = collected(tmp_path / "before", cell, BASE).outputs
    after = collected(tmp_path / "after", cell, {"a": [{}, change], "b": [{}]}).outputs
    assert (after == before) is same


def test_the_outputs_digest_covers_every_sample_and_problem(tmp_path: Path) -> None:
    cell = by_role(cells("h2o"), "policy")
    before = collected(tmp_path / "before", cell, BASE).outputs
    assert collected(tmp_path / "fewer", cell, {"a": [{}, {}]}).outputs != before
    assert collected(tmp_path / "more", cell, {"a": [{}, {}, {}], "b": [{}]}).outputs != before


def test_a_cell_without_samples_is_an_error_naming_it(tmp_path: Path) -> None:
    planned = cells("h2o")
    ran, missing = by_role(planned, "policy"), by_role(planned, "null")
    database = store(tmp_path, ran, BASE)
    with pytest.raises(PrerequisiteError, match=f"{missing.label}.*{missing.run_id}.*no samples"):
        collect([ran, missing], database)


def test_the_reference_file_round_trips_and_refuses_another_format(tmp_path: Path) -> None:
    results = [
        CellResult("k1", "id1", 0.5, 0.4, 0.6, {"p": 0.5}, "d1", "c1"),
        CellResult("k2", "id2", 0.7, 0.65, 0.75, {"p": 0.7, "q": 0.7}, "d2", "c2"),
    ]
    path = reference_path(tmp_path / "runs" / "reference", "ci")
    assert path == tmp_path / "runs" / "reference" / "ci.json"
    write_reference(path, results, ReferenceManifest(suite="ci", python="3.x"))
    manifest, back = read_reference(path)
    assert back == results
    write_reference(path, results[:1], ReferenceManifest(suite="ci"))  # an update overwrites the file
    assert read_reference(path)[1] == results[:1]
    write_reference(path, results, ReferenceManifest(suite="ci", python="3.x"))
    assert manifest.suite == "ci" and manifest.python == "3.x" and (manifest.written or "").endswith("Z")
    document = json.loads(path.read_text())
    assert document["manifest"] == {"suite": "ci", "python": "3.x", "written": manifest.written}
    assert document["format_version"] == FORMAT_VERSION
    path.write_text(json.dumps({**document, "manifest": {**document["manifest"], "python": 3}}))
    with pytest.raises(SpecError, match=f"^{path}: not a ReferenceManifest \\(python: "):
        read_reference(path)
    document["format_version"] = FORMAT_VERSION - 1
    path.write_text(json.dumps(document))
    with pytest.raises(SpecError, match=f"{path}.*format {FORMAT_VERSION - 1}.*reads {FORMAT_VERSION}"):
        read_reference(path)


def test_the_committed_reference_reads_with_this_code() -> None:
    manifest, cells = read_reference(reference_path(POLICY_DIR.parent / "runs" / "reference", "ci"))
    assert manifest.suite == "ci" and manifest.git is not None and len(cells) == 24
    assert all(len(c.outputs) == len(c.code) == 16 for c in cells)


def test_the_digest_is_16_hex_digits_and_ignores_the_order_of_details(tmp_path: Path) -> None:
    cell = by_role(cells("h2o"), "policy")
    one = collected(tmp_path / "one", cell, {"a": [{"secondary": {"x": 1, "y": 2}}]}).outputs
    other = collected(tmp_path / "other", cell, {"a": [{"secondary": {"y": 2, "x": 1}}]}).outputs
    assert one == other and len(one) == 16 and int(one, 16) >= 0
