"""Real models for the backend's tests: the seeded tiny Qwen3 (fast) and the embedded SmolLM2 (slow)."""

from __future__ import annotations

import pytest

from kvbench.adapters.hf.models import LoadedModel, load_model


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return load_model("tiny-qwen3")


@pytest.fixture(scope="session")
def smol() -> LoadedModel:
    return load_model("smollm2-135m")
