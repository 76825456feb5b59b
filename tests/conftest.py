"""Real models for the backend's tests: the seeded tiny Qwen3 (fast) and the embedded SmolLM2 (slow).

Every test run starts from empty caches of its own (kvbench's converted models, Hugging Face's), so a
warm developer cache can never hide a missing dependency or a converter change: the embedded model is
converted from its GGUF file once per test run, exactly as on a new machine.

`make test` spreads the run over the machine's cores with pytest-xdist (``-n auto --dist loadfile``):
a test file stays on one worker, so a module's fixtures (the Ray executor tests' cluster) are made once
and never by two workers at the same time. The workers of one run share those caches (the embedded
model is converted once, under a lock) and the results folders that several files read
(``built_once``: the first worker to need one builds it, the others wait for it).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from built import built_once, run_folder
from invoke import kvbench
from small_run import SMALL_RUN

from kvbench.adapters.hf.models import LoadedModel, load_model
from kvbench.cache_folder import CACHE_ENV

FRESH_CACHES = (CACHE_ENV, "HF_HOME", "HF_DATASETS_CACHE")


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker gets its share of the cores for torch (its subprocesses too, through
    OMP_NUM_THREADS): two workers each running torch on every core would thrash. A thread count the
    caller set is kept."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is None or "OMP_NUM_THREADS" in os.environ:
        return
    import torch

    threads = max(1, len(os.sched_getaffinity(0)) // int(workers))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` run where torch sees a CUDA device and are reported as skipped elsewhere."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: run `pytest -m gpu` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def fresh_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Point kvbench's and Hugging Face's caches at empty folders for this test run (subprocesses too).
    The run's xdist workers share them (kvbench's conversion lands atomically), so the embedded model is
    still converted once per run."""
    root = run_folder(tmp_path_factory) / "caches"
    root.mkdir(exist_ok=True)
    saved = {name: os.environ.get(name) for name in FRESH_CACHES}
    for name in FRESH_CACHES:
        os.environ[name] = str(root / name.lower())
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return load_model("tiny-qwen3")


@pytest.fixture(scope="session")
def smol(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    # one worker converts the GGUF while another waits for its result, rather than converting it too
    with (run_folder(tmp_path_factory) / "smollm2.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def small_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder written by ``SMALL_RUN`` (shards, database, snapshot): copy it before changing it."""

    def build(root: Path) -> Path:
        done = kvbench(*SMALL_RUN, cwd=root)
        assert done.returncode == 0, done.stdout + done.stderr
        return root / "runs"

    return built_once(tmp_path_factory, "small", build)
