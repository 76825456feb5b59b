"""What ran is what is recorded: the runtime in every identity and manifest, models loaded from the spec
they were planned with, local data read as fingerprinted, and damaged shards named and repaired."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import duckdb
import pytest
from invoke import kvbench

from kvbench.errors import SpecError
from kvbench.runner.plan import RunRequest, plan
from kvbench.specs.task import load_task
from kvbench.specs.task_data import data_fingerprint, load_problems

HUB = Path(__file__).resolve().parents[1] / "fixtures" / "hub"
ONE = ["--model", "tiny-qwen3", "--task", "passkey", "--limit", "1", "--quiet", "--no-baselines"]


def computed(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return next(line for line in result.stdout.splitlines() if "problems computed" in line).split(";")[0]


def identity(**fields) -> str:
    cells = plan(RunRequest(models=("tiny-qwen3",), tasks=("passkey",), policies=("snapkv",), **fields))
    return next(c for c in cells if c.role == "policy").run_id


def test_device_kind_dtype_and_attention_are_part_of_the_identity() -> None:
    base = identity()
    assert identity(attention="eager") != base
    assert identity(dtype="bfloat16") != base
    assert identity(device="cuda") != base
    assert identity(device="cuda:1") == identity(device="cuda")  # the kind, not the index
    cells = plan(RunRequest(models=("tiny-qwen3",), tasks=("passkey",), dtype="bfloat16", attention="eager"))
    assert cells[0].spec.record()["runtime"] == {
        "adapter": "hf",
        "device": "cpu",
        "dtype": "bfloat16",
        "attention": "eager",
    }
    assert cells[0].spec.record()["model"]["dtype"] == "bfloat16"
    with pytest.raises(SpecError, match="--device 'gpu' is not a device torch knows"):
        identity(device="gpu")


@pytest.mark.slow
def test_a_resumed_run_never_reuses_another_runtime_in_either_direction(tmp_path: Path) -> None:
    base = [*ONE, "--policy", "snapkv"]
    assert computed(kvbench("run", *base, cwd=tmp_path)) == "1 problems computed, 0 reused"
    eager = [*base, "--attention", "eager"]
    assert computed(kvbench("run", *eager, cwd=tmp_path)) == "1 problems computed, 0 reused"
    assert computed(kvbench("run", *base, cwd=tmp_path)) == "0 problems computed, 1 reused"
    assert computed(kvbench("run", *eager, cwd=tmp_path)) == "0 problems computed, 1 reused"
    bf16 = [*base, "--dtype", "bfloat16"]
    assert computed(kvbench("run", *bf16, cwd=tmp_path)) == "1 problems computed, 0 reused"
    con = duckdb.connect(str(tmp_path / "runs" / "kvbench.duckdb"), read_only=True)
    stored = con.execute("SELECT adapter, device, dtype, attention FROM runs ORDER BY ALL").fetchall()
    con.close()
    assert stored == [
        ("hf", "cpu", "bfloat16", "sdpa"),
        ("hf", "cpu", "float32", "eager"),
        ("hf", "cpu", "float32", "sdpa"),
    ]
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "runs" / "shards").glob("*/manifest.json")]
    assert {m["hardware"]["device"] for m in manifests} == {"cpu"}
    assert {m["spec"]["runtime"]["attention"] for m in manifests} == {"sdpa", "eager"}


@pytest.mark.gpu
def test_a_cuda_run_records_the_gpu(tmp_path: Path) -> None:
    result = kvbench("run", *ONE, "--policy", "snapkv", "--device", "cuda", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    manifest = json.loads(next((tmp_path / "runs" / "shards").glob("*/manifest.json")).read_text())
    import torch

    hardware = manifest["hardware"]
    assert hardware["device"] == "cuda" and hardware["gpu"] == torch.cuda.get_device_name(0)
    assert hardware["gpu_count"] == torch.cuda.device_count() and hardware["torch_cuda"] == torch.version.cuda
    assert manifest["spec"]["runtime"]["device"] == "cuda"


def _model_yaml(path: Path, name: str, layers: int, seed: int) -> Path:
    builtin = Path(__file__).resolve().parents[2] / "suite" / "models" / "tiny-qwen3.yaml"
    text = builtin.read_text().replace("name: tiny-qwen3", f"name: {name}")
    text = text.replace("layers: 2", f"layers: {layers}").replace("seed: 0", f"seed: {seed}")
    path.write_text(text)
    return path


def _answer_logprobs(out: Path) -> dict[str, float]:
    con = duckdb.connect(str(out / "kvbench.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT r.model, s.answer_logprob FROM samples s JOIN runs r USING (run_id)"
    ).fetchall()
    con.close()
    return {model: float(value) for model, value in rows}


@pytest.mark.slow
def test_a_model_yaml_runs_the_model_it_describes(tmp_path: Path) -> None:
    mine = _model_yaml(tmp_path / "mine.yaml", "my-tiny", layers=1, seed=99)
    assert "layers: 1" in mine.read_text() and "seed: 99" in mine.read_text()
    args = ["--task", "passkey", "--limit", "1", "--quiet", "--no-baselines", "--policy", "snapkv"]
    for model in ("tiny-qwen3", str(mine)):
        computed(kvbench("run", "--model", model, *args, cwd=tmp_path))
    logprobs = _answer_logprobs(tmp_path / "runs")
    assert set(logprobs) == {"tiny-qwen3", "my-tiny"}
    assert logprobs["my-tiny"] != logprobs["tiny-qwen3"]  # it ran its own weights, not the built-in's
    con = duckdb.connect(str(tmp_path / "runs" / "kvbench.duckdb"), read_only=True)
    spec = json.loads(con.execute("SELECT spec FROM runs WHERE model = 'my-tiny'").fetchone()[0])
    con.close()
    assert (spec["model"]["source"]["layers"], spec["model"]["source"]["seed"]) == (1, 99)


def test_two_model_specs_sharing_a_name_are_refused(tmp_path: Path) -> None:
    impostor = _model_yaml(tmp_path / "impostor.yaml", "tiny-qwen3", layers=1, seed=99)
    with pytest.raises(SpecError, match="two different model specs are both named 'tiny-qwen3'"):
        plan(RunRequest(models=("tiny-qwen3", str(impostor))))


def test_a_model_yaml_is_loaded_from_the_spec_it_was_planned_with(tmp_path: Path) -> None:
    from kvbench.adapters.hf.models import load_model

    spec = plan(RunRequest(models=(str(_model_yaml(tmp_path / "m.yaml", "tiny-qwen3", 1, 99)),)))[0].model
    assert load_model(spec).facts.num_layers == 1


def test_local_data_is_read_by_content_never_from_a_shared_cache(tmp_path: Path) -> None:
    original = shutil.copytree(HUB / "Idavidrein" / "gpqa", tmp_path / "a" / "gpqa")
    edited = shutil.copytree(original, tmp_path / "b" / "gpqa")  # same folder name, other content
    csv = edited / "gpqa_diamond.csv"
    csv.write_text(csv.read_text().replace("recFixture", "recEdited"))
    task = load_task("gpqa-diamond")
    assert [p.problem_id for p in load_problems(task, original)] == [f"recFixture{i}" for i in range(3)]
    assert [p.problem_id for p in load_problems(task, edited)] == [f"recEdited{i}" for i in range(3)]
    for cache in (os.environ["HF_HOME"], os.environ["HF_DATASETS_CACHE"]):
        for path in Path(cache).rglob("*") if Path(cache).exists() else []:
            assert not path.is_file() or b"PRIVATE-FIXTURE" not in path.read_bytes(), path
    stale = data_fingerprint(original)
    csv.write_text(csv.read_text() + "")
    with pytest.raises(SpecError, match="changed after this run was planned"):
        load_problems(task, edited, fingerprint=stale)


def _counts(database: Path) -> tuple:
    con = duckdb.connect(str(database), read_only=True)
    try:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if "runs" not in tables:
            return (0, 0)
        return con.execute("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM samples)").fetchone()
    finally:
        con.close()


def _measured(shard: Path) -> list[dict]:
    """A shard's rows without their timings, which no two runs share."""
    import pyarrow.parquet as pq

    rows = pq.read_table(shard).to_pylist()
    for row in rows:
        row.pop("wall_seconds")
        row.pop("eviction_seconds")
        secondary = json.loads(row.pop("secondary"))
        row["secondary"] = {k: v for k, v in secondary.items() if not k.endswith("seconds")}
    return rows


@pytest.mark.slow
def test_a_damaged_shard_is_named_and_a_rerun_repairs_it(tmp_path: Path) -> None:
    args = ["--model", "tiny-qwen3", "--task", "passkey", "--limit", "2", "--quiet", "--policy", "snapkv"]
    computed(kvbench("run", *args, cwd=tmp_path))
    runs = tmp_path / "runs"
    before = _counts(runs / "kvbench.duckdb")
    shard = sorted((runs / "shards").glob("*/*.parquet"))[0]
    good = shard.read_bytes()
    original = _measured(shard)
    shard.write_bytes(good[: len(good) // 2])  # truncated, as by a full disk
    result = kvbench("ingest", "--out", "runs", cwd=tmp_path)
    assert result.returncode == 2
    message = " ".join(result.stderr.split())
    assert str(shard.relative_to(tmp_path)) in message or str(shard) in message
    assert "nothing was ingested" in message and "run the same `kvbench run` again" in message
    assert _counts(runs / "kvbench.duckdb") == before
    # on a fresh database a failed ingest leaves nothing half-written
    fresh = tmp_path / "fresh"
    shutil.copytree(runs / "shards", fresh / "shards")
    assert kvbench("ingest", "--out", str(fresh), cwd=tmp_path).returncode == 2
    assert _counts(fresh / "kvbench.duckdb") == (0, 0)
    # the same run recomputes exactly the damaged problem, and its rows equal the original's
    assert computed(kvbench("run", *args, cwd=tmp_path)) == "1 problems computed, 5 reused"
    assert _measured(shard) == original
    assert _counts(runs / "kvbench.duckdb") == before
    assert shard.with_name(shard.name + ".damaged").is_file()  # set aside for inspection, not ingested


@pytest.mark.slow
def test_an_edited_scorer_file_is_another_run_and_reuses_nothing(tmp_path: Path) -> None:
    """Editing a file scorer and running again computes again: its source hash is in its identity (it was
    left out, and the edited scorer reused the old file's results, its manifest keeping the old hash)."""
    scorer = tmp_path / "mine.py"
    scorer.write_text(
        "from kvbench import Policy, policy\n\n\n@policy('mine')\nclass Mine(Policy):\n"
        "    def score(self, view):\n        return view.keys.float().norm(dim=-1)\n"
    )
    args = ["run", *ONE, "--policy", "mine.py:Mine"]
    assert computed(kvbench(*args, cwd=tmp_path)) == "1 problems computed, 0 reused"
    assert computed(kvbench(*args, cwd=tmp_path)) == "0 problems computed, 1 reused"
    scorer.write_text(scorer.read_text().replace("norm(dim=-1)", "norm(dim=-1).neg()"))
    assert computed(kvbench(*args, cwd=tmp_path)) == "1 problems computed, 0 reused"
    with duckdb.connect(str(tmp_path / "runs" / "kvbench.duckdb"), read_only=True) as con:
        recorded = con.execute("SELECT spec->'policy'->>'source_sha256' FROM runs ORDER BY run_id").fetchall()
    assert len(recorded) == 2 and {r[0] for r in recorded} == {
        hashlib.sha256(text.encode()).hexdigest()
        for text in (scorer.read_text(), scorer.read_text().replace(".neg()", ""))
    }


@pytest.mark.slow
def test_a_grown_limit_reuses_the_stored_problems_and_computes_only_the_new(tmp_path: Path) -> None:
    """--limit 2 after --limit 1: each arm's first problem is copied from the smaller run (a problem's
    samples depend on it alone), the second computed; the rows equal a fresh --limit 2 run's, digest for
    digest, and the smaller run is left as it was."""
    args = ["--model", "tiny-qwen3", "--task", "passkey", "--policy", "snapkv", "--samples", "2", "--quiet"]
    grown, fresh = tmp_path / "grown", tmp_path / "fresh"
    grown.mkdir(), fresh.mkdir()
    assert computed(kvbench("run", *args, "--limit", "1", cwd=grown)) == "3 problems computed, 0 reused"
    small = {p: p.read_bytes() for p in (grown / "runs" / "shards").glob("*/*.parquet")}
    assert computed(kvbench("run", *args, "--limit", "2", cwd=grown)) == "3 problems computed, 3 reused"
    assert computed(kvbench("run", *args, "--limit", "2", cwd=fresh)) == "6 problems computed, 0 reused"
    assert {p: p.read_bytes() for p in small} == small

    def rows(folder: Path) -> list[tuple]:
        con = duckdb.connect(str(folder / "runs" / "kvbench.duckdb"), read_only=True)
        return con.execute(
            "SELECT r.policy, s.problem_id, s.sample, s.output, s.metric FROM samples s JOIN runs r "
            "USING (run_id) WHERE r.spec->>'limit' = '2' ORDER BY ALL"
        ).fetchall()

    assert len(rows(fresh)) == 3 * 2 * 2 and rows(grown) == rows(fresh)
