"""kvbench as an lm-eval model: `kvbench lm-eval --model kvbench ...` on local lm-eval tasks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from lm_eval_fixtures import letter_overlap, read_output

from kvbench.core.seeding import sample_seed
from kvbench.errors import SpecError

pytestmark = pytest.mark.slow


def events_expected(prompt: int, generated: int, budget: int, buffer: int) -> int:
    """Eviction events of one decode, from the schedule's rule: the cache holds prompt + generated − 1
    slots' worth of tokens at the end (the last token is never fed), and evicts back to K each time it
    reaches K + B."""
    return max(0, (prompt + generated - 1 - budget) // buffer)


def test_command_evicts_and_its_score_is_the_sample_logs(lm_eval_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "kvbench",
        "lm-eval",
        "--model",
        "kvbench",
        "--model_args",
        "model=tiny-qwen3,policy=snapkv,budget=64,buffer=16",
        "--device",
        "cpu",
        "--tasks",
        "kvb_echo",
        "--include_path",
        str(lm_eval_dir / "lm_eval_tasks"),
        "--limit",
        "4",
        "--output_path",
        str(out),
        "--log_samples",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ | {"TQDM_DISABLE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    results, samples = read_output(out)

    kv = results["config"]["kvbench"]
    assert kv["policy"]["name"] == "snapkv" and kv["budget"] == 64 and kv["buffer"] == 16
    assert len(kv["requests"]) == 4
    for request in kv["requests"]:
        (generated,) = request["generated_tokens"]
        assert request["eviction_events"] == events_expected(request["prompt_tokens"], generated, 64, 16)
        assert request["eviction_events"] > 0
    assert kv["totals"]["eviction_events"] == sum(r["eviction_events"] for r in kv["requests"])

    logged = samples["kvb_echo"]
    assert len(logged) == 4
    by_hand = [letter_overlap(s["filtered_resps"][0], s["doc"]["word"]) for s in logged]
    assert [s["letter_overlap"] for s in logged] == pytest.approx(by_hand)
    assert results["results"]["kvb_echo"]["letter_overlap,none"] == pytest.approx(sum(by_hand) / 4)
    assert 0 < sum(by_hand) < 4  # a score that varies, so that the comparison above can fail


def _evaluate(model, tasks: list[str], lm_eval_dir: Path, **kwargs):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(lm_eval_dir / "lm_eval_tasks"), include_defaults=False)
    return simple_evaluate(
        model=model, tasks=tasks, task_manager=manager, limit=4, log_samples=True, **kwargs
    )


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-qwen3's weights and tokenizer saved as a transformers checkpoint, for lm-eval's own HF model."""
    from kvbench.adapters.hf.models import load_model

    folder = tmp_path_factory.mktemp("tiny-qwen3")
    loaded = load_model("tiny-qwen3")
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return folder


def test_full_cache_gives_lm_eval_hf_models_outputs(lm_eval_dir: Path, tiny_checkpoint: Path) -> None:
    from kvbench.lmeval.model import KVBenchLM

    tasks = ["kvb_echo", "kvb_choice", "kvb_rolling"]
    theirs = _evaluate(
        "hf",
        tasks,
        lm_eval_dir,
        model_args={"pretrained": str(tiny_checkpoint), "dtype": "float32"},
        device="cpu",
    )
    ours = _evaluate(KVBenchLM(model="tiny-qwen3", policy="full"), tasks, lm_eval_dir)
    for task in tasks:
        expected = [s["resps"] for s in theirs["samples"][task]]
        got = [s["resps"] for s in ours["samples"][task]]
        if task == "kvb_echo":
            assert got == expected  # greedy text, identical
            continue
        flat_expected = [r for doc in expected for request in doc for r in request]
        flat_got = [r for doc in got for request in doc for r in request]
        assert len(flat_got) == len(flat_expected) > 0
        for mine, reference in zip(flat_got, flat_expected, strict=True):
            if isinstance(reference, list | tuple):  # loglikelihood: (log p, is greedy)
                assert mine[0] == pytest.approx(reference[0], rel=1e-4, abs=1e-3)
                assert mine[1] == reference[1]
            else:  # loglikelihood_rolling: log p
                assert mine == pytest.approx(reference, rel=1e-4, abs=1e-3)
    totals = ours["config"]["kvbench"]["totals"]
    assert totals["eviction_events"] == 0 and totals["requests"] == 4 + 12 + 4


def test_teacher_forced_requests_evict_on_the_schedule(lm_eval_dir: Path) -> None:
    from kvbench.lmeval.model import KVBenchLM

    model = KVBenchLM(model="tiny-qwen3", policy="snapkv", budget=48, buffer=16)
    results = _evaluate(model, ["kvb_rolling"], lm_eval_dir)
    requests = results["config"]["kvbench"]["requests"]
    assert {r["kind"] for r in requests} == {"loglikelihood_rolling"}
    for request in requests:
        # teacher forcing feeds every continuation token: the cache ends holding prompt + continuation
        tokens = request["prompt_tokens"] + request["continuation_tokens"]
        assert request["eviction_events"] == max(0, (tokens - 48) // 16) > 0
    perplexity = results["results"]["kvb_rolling"]["word_perplexity,none"]
    assert perplexity > 0


def test_repeats_decode_as_one_batch_with_kvbench_seeds(lm_eval_dir: Path) -> None:
    from kvbench.lmeval.model import KVBenchLM

    model = KVBenchLM(model="tiny-qwen3", policy="snapkv", budget=96, buffer=16)
    results = _evaluate(model, ["kvb_echo_samples"], lm_eval_dir)
    requests = results["config"]["kvbench"]["requests"]
    assert len(requests) == 4  # one decode per document, not one per repeat
    for request in requests:
        assert request["samples"] == 3
        assert request["sampling"]["temperature"] == 1.0
        doc = request["doc_id"]
        assert request["seeds"] == [sample_seed(0, "kvb_echo_samples", doc, i) for i in range(3)]
    logged = results["samples"]["kvb_echo_samples"]
    for sample in logged:
        (answers,) = sample["resps"]  # one request per document, its three responses
        assert len(answers) == 3 and len(set(answers)) == 3  # three sampled answers, all logged
        # lm-eval without a filter scores the first answer only (its `take_first`)
        assert sample["letter_overlap"] == pytest.approx(letter_overlap(answers[0], sample["doc"]["word"]))


def test_model_args_are_checked_before_the_model_loads() -> None:
    from kvbench.lmeval.model import KVBenchLM

    with pytest.raises(SpecError, match=r"budget K=64 must be larger than the buffer B=64.*buffer="):
        KVBenchLM(model="tiny-qwen3", policy="snapkv", budget=64)
    with pytest.raises(SpecError, match=r"windw= is not a model arg of kvbench \(known: model, policy"):
        KVBenchLM(model="tiny-qwen3", policy="snapkv", budget=128, windw=3)
    with pytest.raises(SpecError, match=r"policy= is required"):
        KVBenchLM(model="tiny-qwen3")
    with pytest.raises(SpecError, match=r"needs n_avg="):
        KVBenchLM(model="tiny-qwen3", policy="snapkv")
    with pytest.raises(SpecError, match=r"batch_size must be 1"):
        KVBenchLM(model="tiny-qwen3", policy="full", batch_size=4)


def test_generation_arguments_it_cannot_follow_are_refused(lm_eval_dir: Path) -> None:
    from kvbench.lmeval.model import KVBenchLM

    model = KVBenchLM(model="tiny-qwen3", policy="full")
    with pytest.raises(SpecError, match=r"task 'kvb_echo', doc 0.*repetition_penalty"):
        _evaluate(model, ["kvb_echo"], lm_eval_dir, gen_kwargs={"repetition_penalty": 1.2})


def test_register_keeps_lm_evals_own_models() -> None:
    from lm_eval.api.registry import get_model

    from kvbench.lmeval.model import KVBenchLM, register

    register()
    register()  # twice is harmless
    assert get_model("kvbench") is KVBenchLM
    assert get_model("hf").__name__ == "HFLM"


def test_lm_evals_request_cache_is_refused(lm_eval_dir: Path, tmp_path: Path) -> None:
    """Its key holds the request, not the policy: another policy's run would read this one's answers."""
    from sqlitedict import SqliteDict

    from kvbench.lmeval.model import KVBenchLM

    model = KVBenchLM(model="tiny-qwen3", policy="full")
    with pytest.raises(SpecError, match=r"--use_cache"):
        _evaluate(model, ["kvb_echo"], lm_eval_dir, use_cache=str(tmp_path / "cache"))
    assert sum(len(SqliteDict(str(db))) for db in tmp_path.glob("cache*.db")) == 0  # nothing stored
