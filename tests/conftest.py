"""Real models for the backend's tests: the seeded tiny Qwen3 (fast) and the embedded SmolLM2 (slow).

Every test run starts from empty caches of its own (kvbench's converted models, Hugging Face's), so a
warm developer cache can never hide a missing dependency or a converter change: the embedded model is
converted from its GGUF file once per test run, exactly as on a new machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from small_run import SMALL_RUN

from kvbench.adapters.hf.models import CACHE_ENV, LoadedModel, load_model

FRESH_CACHES = (CACHE_ENV, "HF_HOME", "HF_DATASETS_CACHE")


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
    """Point kvbench's and Hugging Face's caches at empty folders for this test run (subprocesses too)."""
    root = tmp_path_factory.mktemp("caches")
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
def smol() -> LoadedModel:
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def small_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder written by ``SMALL_RUN`` (shards, database, snapshot): copy it before changing it."""
    root = tmp_path_factory.mktemp("small")
    kvbench = Path(sys.executable).parent / "kvbench"
    done = subprocess.run([str(kvbench), *SMALL_RUN], capture_output=True, text=True, cwd=root, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "runs"
