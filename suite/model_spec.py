"""Model specs (suite/models/*.yaml): which weights, which tokenizer, which family's sampling."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pydantic

from kvbench.specs import StrictSpec, find_spec_file, load_spec, spec_names

Family = Literal["qwen3", "phi4-reasoning", "smollm2", "tiny"]


class GgufPackage(StrictSpec):
    """A GGUF file shipped inside an installed Python package (located without importing it)."""

    kind: Literal["gguf-package"]
    package: str
    """Import name of the package that holds the file."""
    pip: str
    """What to pip-install when the package is missing."""
    filename: str


class HubCheckpoint(StrictSpec):
    """A transformers checkpoint: a hub repository at a pinned revision, or a local folder in that format."""

    kind: Literal["hub"]
    repo: str
    revision: str = "main"


class RandomQwen3(StrictSpec):
    """A Qwen3 with seeded random weights, built from this config, and a byte-level tokenizer."""

    kind: Literal["random-qwen3"]
    seed: int = 0
    layers: int = 2
    hidden_size: int = 64
    intermediate_size: int = 128
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    rope_theta: float = 10000.0
    max_positions: int = 32768
    init_std: float = 0.3
    """Weight init std: large enough that greedy outputs depend on the context (0.02 repeats one token)."""


Source = Annotated[GgufPackage | HubCheckpoint | RandomQwen3, pydantic.Field(discriminator="kind")]


class ModelSpec(StrictSpec):
    spec_version: Literal[1] = 1
    name: str
    description: str
    family: Family
    """Selects the protocol's sampling settings (Qwen3: T=0.6, top_p=0.95; Phi-4-reasoning: T=0.8, ...)."""
    dtype: Literal["float32", "bfloat16"]
    source: Source


def model_names() -> list[str]:
    return spec_names("models")


def load_model_spec(name_or_path: str | Path) -> ModelSpec:
    """A built-in model by name (``kvbench list models``) or a user's model YAML by path."""
    return load_spec(find_spec_file("model", "models", str(name_or_path)), ModelSpec)
