"""The memory plan (kvbench.runner.memory): a problem's samples in micro-batches decode the rows one batch
does, on the real tiny Qwen3; the plan's numbers, worked out here again from the model's config.json;
the refusal when one sample cannot fit; the plan printed for Qwen3-8B × 16 samples × 32k tokens."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from invoke import kvbench
from rich.filesize import decimal

from kvbench.adapters.hf.backend import HFBackend
from kvbench.runner.memory import MemoryLimits
from kvbench.runner.orchestrate import run_cells
from kvbench.runner.plan import RunRequest, plan

FIXTURES = Path(__file__).parents[1] / "fixtures"
GSM8K = FIXTURES / "hub" / "openai" / "gsm8k"
QWEN3_8B = FIXTURES / "qwen3-8b" / "config.json"
REVISION = "b968826d9c46dd6066d109eabc6255188de91218"
PROTOCOL = (Path(__file__).parents[2] / "suite" / "protocols" / "sink-only.yaml").read_text()
MEASURED = {"wall_seconds", "eviction_seconds", "kv_peak_bytes"}
"""What a micro-batch changes: the unit's timings and the peak memory its batch shared among its rows."""
GiB = 1 << 30
KVBENCH = str(Path(sys.executable).parent / "kvbench")


def _protocol(tmp_path: Path) -> str:
    """sink-only with an 8-token buffer: a 32-token budget evicts many times in 48 new tokens."""
    path = tmp_path / "b8.yaml"
    path.write_text(PROTOCOL.replace("name: sink-only", "name: b8").replace("buffer: 64", "buffer: 8"))
    return str(path)


def _rows(out: Path) -> dict[tuple[str, str], list[dict]]:
    """(run id, shard) -> its rows without what a micro-batch changes, straight from Parquet."""
    return {
        (path.parent.name, path.name): [
            {k: v for k, v in row.items() if k not in MEASURED} for row in pq.read_table(path).to_pylist()
        ]
        for path in sorted(out.glob("shards/*/*.parquet"))
    }


def test_micro_batches_decode_the_rows_one_batch_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 samples at once, in 2 × 2 and in 4 × 1: the same outputs, lengths, evictions and verdicts for a
    policy reading queries (snapkv), one observing every step (h2o), the null's random draws and the full
    cache; each sample's sampling and eviction draws come from its own seed."""
    cells = plan(
        RunRequest(
            models=("tiny-qwen3",),
            tasks=("gsm8k",),
            data=str(GSM8K),
            policies=("snapkv", "h2o"),
            protocol=_protocol(tmp_path),
            samples=4,
            limit=1,
            budget=32,
            max_new_tokens=48,
        )
    )
    decoded: list[int] = []  # the rows of every generate call
    generate = HFBackend.generate

    def counted(self: HFBackend, *args, **kwargs):
        decoded.append(len(kwargs["sample_seeds"]))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(HFBackend, "generate", counted)
    outs = {}
    for name, limits in (("whole", None), ("pairs", MemoryLimits(max_batch=2)), ("ones", MemoryLimits(1))):
        decoded.clear()
        run_cells(cells, tmp_path / name, progress=False, memory=limits)
        outs[name] = _rows(tmp_path / name)
        size = 4 if limits is None else limits.max_batch
        assert decoded == [size] * (len(cells) * 4 // size), name  # arms × samples / size

    whole = outs["whole"]
    assert outs["pairs"] == whole and outs["ones"] == whole
    rows = [row for shard in whole.values() for row in shard]
    assert len(rows) == 4 * 4 and {row["sample"] for row in rows} == {0, 1, 2, 3}
    evicting = [row for row in rows if row["evictions"] > 0]
    assert len(evicting) == 3 * 4  # every evicting arm's sample evicted
    # the samples of a problem differ: each row's draws are its own, so a split that mixed them would show
    for shard in whole.values():
        assert len({row["output"] for row in shard}) > 1

    # the micro-batch is recorded with the results, outside the identity
    for cell in cells:
        manifest = json.loads((tmp_path / "pairs" / "shards" / cell.run_id / "manifest.json").read_text())
        assert manifest["memory_plan"]["batch"] == 2 and manifest["memory_plan"]["batches"] == 2
        assert manifest["run_id"] == cell.run_id
    assert {p.parent.name for p in (tmp_path / "ones").glob("shards/*/*.parquet")} == {
        c.run_id for c in cells
    }


# -- the plan's numbers, from config.json by the rules docs/gpu.md states ------------------------------


def parameters(config: dict) -> int:
    """A Qwen3's parameters: embeddings (and an untied LM head), per layer the q/k/v/o projections, q and
    k norms, two RMSNorms and the SwiGLU MLP; the final norm."""
    hidden, inner, dim = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * dim, config["num_key_value_heads"] * dim
    layer = hidden * q + 2 * hidden * kv + q * hidden + 2 * dim + 2 * hidden + 3 * hidden * inner
    embeddings = config["vocab_size"] * hidden * (1 if config["tie_word_embeddings"] else 2)
    return embeddings + config["num_hidden_layers"] * layer + hidden


def full_cache_slots(prompt: int, new: int, reserve: int = 4096) -> int:
    """The full cache reserves the prompt and 4096 tokens, then doubles until prompt + new fit."""
    slots = min(prompt + new, prompt + reserve)
    while slots < prompt + new:
        slots *= 2
    return slots


class Planned:
    """One arm of a model, by the documented arithmetic: weights, cache per sample, activations, reserve."""

    def __init__(self, config: dict, dtype_bytes: int, prompt: int, budget: int | None, buffer: int) -> None:
        self.c, self.b, self.prompt, self.budget, self.buffer = config, dtype_bytes, prompt, budget, buffer

    def slots(self, new: int) -> int:
        if self.budget is not None and self.prompt + new > self.budget:
            return max(self.budget, self.prompt) + self.buffer
        return full_cache_slots(self.prompt, new)

    def cache(self, new: int) -> int:
        """One sample's cache at its peak."""
        layers, hkv, dim = self.c["num_hidden_layers"], self.c["num_key_value_heads"], self.c["head_dim"]
        slots = self.slots(new)
        slot = hkv * (2 * dim * self.b + 8)  # key and value, and an int64 position, per KV head
        if self.budget is not None and self.prompt + new > self.budget:
            # an event: the cache and its compacted copy, and every layer's fp32 scores twice
            return 2 * layers * slots * slot + layers * hkv * slots * 4 * 2
        return (layers + 1) * slots * slot  # one layer's copy while it grows

    def activations(self, rows: int, new: int) -> int:
        c, b = self.c, self.b
        hq, hkv, dim = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        width = 3 * c["intermediate_size"] + 6 * c["hidden_size"]
        decode = rows * (c["vocab_size"] * 40 + hq * self.slots(new) * 4 * 2 + width * b)
        prefill = self.prompt * (width + (hq + 2 * hkv) * dim) * b + hq * self.prompt**2 * 4 * 2
        return max(decode, prefill)

    def total(self, rows: int, new: int) -> int:
        return parameters(self.c) * self.b + rows * self.cache(new) + self.activations(rows, new) + GiB

    def batch(self, samples: int, device: int, new: int) -> tuple[int, int]:
        """(micro-batch, micro-batches): the most rows that fit, then spread evenly."""
        most = max(rows for rows in range(1, samples + 1) if self.total(rows, new) <= device)
        batches = math.ceil(samples / most)
        return math.ceil(samples / batches), batches


def _hub_cache(root: Path) -> dict[str, str]:
    """An environment whose Hugging Face cache holds Qwen3-8B's config.json at the pinned revision (as
    `hf download Qwen/Qwen3-8B config.json --revision ...` leaves it) and nothing else; offline."""
    snapshot = root / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(QWEN3_8B.read_text())
    return {**os.environ, "HF_HOME": str(root), "HF_HUB_OFFLINE": "1"}


def _local_spec(tmp_path: Path) -> str:
    """The shipped qwen3-8b spec with its checkpoint a local folder that holds only config.json."""
    spec = (Path(__file__).parents[2] / "suite" / "models" / "qwen3-8b.yaml").read_text()
    path = tmp_path / "qwen3-8b.yaml"
    path.write_text(spec.replace("repo: Qwen/Qwen3-8B", f"repo: {QWEN3_8B.parent}"))
    return str(path)


PLAN_8B = [
    *("run", "--plan-only", "--task", "aime25", "--policy", "streaming"),
    *("--samples", "16", "--max-new-tokens", "32768", "--prompt-tokens", "512"),
]


def table(stdout: str) -> dict[str, list[str]]:
    """The printed plan's rows: arm -> its cells (tokens, K, slots, cache/sample, batch, batches,
    activations, total)."""
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in stdout.splitlines() if "│" in line]
    return {row[0]: row[1:] for row in rows}


def test_the_plan_for_qwen3_8b_16_samples_of_32k_tokens_on_80_gb(tmp_path: Path) -> None:
    config = json.loads(QWEN3_8B.read_text())
    assert parameters(config) == 8_190_735_360  # Qwen3-8B's published 8.2B
    # a process of its own: the Hugging Face cache's place is read when huggingface_hub is imported
    done = subprocess.run(
        [KVBENCH, *PLAN_8B, "--model", "qwen3-8b", "--gpu-memory", "80GB"],
        env=_hub_cache(tmp_path / "hf"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    # 36 layers × 8 KV heads × 128 × (key, value) × 2 bytes: the 77 GB for 16 × 32k tokens
    assert "KV 147,456 bytes per token" in text and 16 * 32768 * 147_456 == 77_309_411_328
    assert f"weights {decimal(parameters(config) * 2)} ({parameters(config):,} parameters × 2 bytes)" in text
    assert "(80.0 GB: --gpu-memory 80GB)" in text

    full = Planned(config, 2, prompt=512, budget=None, buffer=64)
    assert full.total(16, 32768) > 80e9  # all 16 at once do not fit
    batch, batches = full.batch(16, int(80e9), 32768)
    assert (batch, batches) == (8, 2)
    rows = table(done.stdout)
    assert rows["qwen3-8b/aime25/full@K=4096"] == [
        "512+32,768",
        "-",
        f"{full.slots(32768):,}",
        decimal(full.cache(32768)),
        f"{batch} of 16",
        str(batches),
        decimal(full.activations(batch, 32768)),
        decimal(full.total(batch, 32768)),
    ]
    # the evicting arms at the declared N_avg 16384 / 4: K + B slots, all 16 samples at once
    evicting = Planned(config, 2, prompt=512, budget=4096, buffer=64)
    assert evicting.batch(16, int(80e9), 32768) == (16, 1)
    streaming = rows["qwen3-8b/aime25/streaming@K=N_avg/4"]
    assert streaming[:6] == ["512+32,768", "4,096", "4,160", decimal(evicting.cache(32768)), "16 of 16", "1"]
    assert streaming[7] == decimal(evicting.total(16, 32768))


def test_one_sample_that_cannot_fit_is_refused_with_the_numbers_and_the_fix(tmp_path: Path) -> None:
    config = json.loads(QWEN3_8B.read_text())
    done = kvbench(*PLAN_8B, "--model", _local_spec(tmp_path), "--gpu-memory", "20GB")
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    full = Planned(config, 2, prompt=512, budget=None, buffer=64)
    fitting = max(n for n in range(1, 32769) if full.total(1, n) <= 20e9)
    assert (
        f"qwen3-8b/aime25/full@K=4096: one sample needs {decimal(full.total(1, 32768))} "
        f"({decimal(parameters(config) * 2)} of weights + {decimal(full.cache(32768))} of cache" in message
    )
    assert f"{full.slots(32768):,} slots per layer and KV head" in message
    assert f"over the 20.0 GB of the device (--gpu-memory 20GB): --max-new-tokens {fitting:,} fits" in message
    assert "streaming" not in message  # the evicting arms fit: only the full cache is named

    weights_only = kvbench(*PLAN_8B, "--model", _local_spec(tmp_path), "--gpu-memory", "16GB")
    assert weights_only.returncode == 2
    assert "the weights alone do not fit" in weights_only.stderr


def test_a_device_that_holds_two_samples_runs_pairs_and_prints_its_plan(tmp_path: Path) -> None:
    """The tiny Qwen3 on a simulated device that holds the full cache's samples two at a time: the plan
    printed before the first token, the rows those of one batch of four."""
    from kvbench.adapters.hf.models import load_model, model_config
    from kvbench.specs.model import load_model_spec
    from kvbench.specs.task import load_task
    from kvbench.specs.task_data import load_problems

    config = model_config(load_model_spec("tiny-qwen3")).to_dict()
    backend = HFBackend(load_model("tiny-qwen3"))
    problems = load_problems(load_task("gsm8k"), GSM8K, 1, None)
    prompt = max(len(p.encoded(backend)) for p in problems)
    common = [
        *("run", "--model", "tiny-qwen3", "--task", "gsm8k", "--data", str(GSM8K), "--policy", "streaming"),
        *("--protocol", _protocol(tmp_path), "--budget", "32", "--samples", "4", "--limit", "1"),
        *("--max-new-tokens", "48", "--quiet"),
    ]
    whole = kvbench(*common, "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    assert "memory plan" not in whole.stdout  # on CPU, nothing bounds a batch unless asked

    full = Planned(config, 4, prompt=prompt, budget=None, buffer=8)
    device = full.total(2, 48) + 1  # two of the full cache's samples, not three
    assert full.total(3, 48) > device
    paired = kvbench(*common, "--out", str(tmp_path / "paired"), "--gpu-memory", str(device))
    assert paired.returncode == 0, paired.stderr
    text = " ".join(paired.stdout.split())
    assert f"memory plan: tiny-qwen3 in float32 ({decimal(device)}: --gpu-memory {device})" in text
    rows = table(paired.stdout)
    assert rows["tiny-qwen3/gsm8k/full@K=32"][:6] == [
        f"{prompt}+48",
        "-",
        str(full.slots(48)),
        decimal(full.cache(48)),
        "2 of 4",
        "2",
    ]
    evicting = Planned(config, 4, prompt=prompt, budget=32, buffer=8)
    batch, batches = evicting.batch(4, device, 48)
    assert rows["tiny-qwen3/gsm8k/streaming@K=32"][2:6] == [
        str(max(32, prompt) + 8),
        decimal(evicting.cache(48)),
        f"{batch} of 4",
        str(batches),
    ]
    assert _rows(tmp_path / "paired") == _rows(tmp_path / "whole")


@pytest.mark.gpu
def test_on_cuda_the_plan_reads_the_devices_free_memory(tmp_path: Path) -> None:
    """On a CUDA device the plan is printed unasked, against the memory free before the model loaded
    (the tiny Qwen3's four samples fit at once)."""
    done = kvbench(
        *("run", "--model", "tiny-qwen3", "--task", "gsm8k", "--data", str(GSM8K), "--policy", "streaming"),
        *("--protocol", _protocol(tmp_path), "--budget", "32", "--samples", "4", "--limit", "1"),
        *("--max-new-tokens", "16", "--device", "cuda", "--quiet", "--out", str(tmp_path / "runs")),
    )
    assert done.returncode == 0, done.stderr
    assert "free on cuda before the model loaded" in " ".join(done.stdout.split())
    assert [row[4] for row in table(done.stdout).values()] == ["4 of 4"] * 3


def test_the_planned_slots_are_what_the_caches_buffers_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's slots against the real cache: the capacity of every layer's buffers over a whole decode,
    for an evicting arm (its first reservation, then K + B after each event) and for the full cache
    (which reserves the prompt and 16 more tokens here, then doubles)."""
    from kvbench.adapters.hf.decode import generate
    from kvbench.adapters.hf.models import load_model
    from kvbench.runner.memory import cache_slots
    from kvbench.specs.task import load_task
    from kvbench.specs.task_data import load_problems

    monkeypatch.setattr("kvbench.core.layer_kv.FIRST_RESERVE", 16)
    loaded = load_model("tiny-qwen3")
    backend = HFBackend(loaded)
    problem = load_problems(load_task("gsm8k"), GSM8K, 1, None)[0]
    prompt = problem.encoded(backend)
    cells = plan(
        RunRequest(
            models=("tiny-qwen3",),
            tasks=("gsm8k",),
            data=str(GSM8K),
            policies=("streaming",),
            protocol=_protocol(tmp_path),
            samples=2,
            budget=32,
            max_new_tokens=48,
        )
    )
    reached: list[int] = []
    for cell in cells:
        reached.clear()
        generate(
            loaded,
            prompt,
            cell.policy,
            cell.schedule(),
            sample_seeds=[1, 2],
            max_new_tokens=48,
            ignore_stop=True,
            on_step=lambda cache: reached.extend(layer.slots.capacity for layer in cache.evicting_layers),
        )
        slots, budget = cache_slots(cell, backend.shape, len(prompt), 48)
        assert max(reached) == slots, cell.label
        assert (budget is None) == (cell.role == "reference")
    full = next(c for c in cells if c.role == "reference")
    assert cache_slots(full, backend.shape, len(prompt), 48)[0] == full_cache_slots(len(prompt), 48, 16)


@pytest.mark.parametrize("fixture", ["tiny", "smol"])
def test_a_models_shape_from_its_config_is_the_loaded_models(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    """What --plan-only reads without weights (the random Qwen3's settings; the GGUF file's metadata,
    SmolLM2-135M's 134,515,008 parameters with tied embeddings) is the loaded model's."""
    from kvbench.adapters.hf.models import model_shape

    loaded = request.getfixturevalue(fixture)
    shape = HFBackend(loaded).shape
    assert model_shape(loaded.spec) == shape
    assert shape.parameters == sum(p.numel() for p in loaded.model.parameters())
    if fixture == "smol":
        assert shape.parameters == 134_515_008
        assert shape.kv_bytes_per_token == 30 * 3 * 64 * 2 * 4
