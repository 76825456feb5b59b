"""Model specs (suite/models/*.yaml): which weights, which tokenizer, which family's sampling."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic

from kvbench.specs.loading import StrictSpec, find_spec_file, load_spec, spec_names

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
    seed: int = pydantic.Field(default=0, ge=0)
    layers: int = pydantic.Field(default=2, ge=1, le=256)
    hidden_size: int = pydantic.Field(default=64, ge=1, le=1 << 16)
    intermediate_size: int = pydantic.Field(default=128, ge=1, le=1 << 18)
    heads: int = pydantic.Field(default=4, ge=1, le=1024)
    kv_heads: int = pydantic.Field(default=2, ge=1, le=1024)
    """Must divide ``heads`` (grouped-query attention)."""
    head_dim: int = pydantic.Field(default=16, ge=2, le=1024)
    """Even: RoPE rotates pairs of dimensions."""
    rope_theta: float = pydantic.Field(default=10000.0, gt=0)
    max_positions: int = pydantic.Field(default=32768, ge=1, le=1 << 24)
    init_std: float = pydantic.Field(default=0.3, gt=0)
    """Weight init std: large enough that greedy outputs depend on the context (0.02 repeats one token)."""

    @pydantic.model_validator(mode="after")
    def _shapes_fit(self) -> RandomQwen3:
        if self.heads % self.kv_heads:
            raise ValueError(
                f"kv_heads ({self.kv_heads}) must divide heads ({self.heads}): each KV head serves a whole "
                "group of query heads"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even: RoPE rotates pairs of dimensions")
        return self


Source = Annotated[GgufPackage | HubCheckpoint | RandomQwen3, pydantic.Field(discriminator="kind")]


class ModelSpec(StrictSpec):
    spec_version: Literal[1] = 1
    name: str
    description: str
    family: Family
    """Selects the protocol's sampling settings (Qwen3: T=0.6, top_p=0.95; Phi-4-reasoning: T=0.8, ...)."""
    dtype: Literal["float32", "bfloat16"]
    source: Source
    # Fields added after spec version 1 join a model's identity only when set away from their default,
    # so that the identities (and stored results) of specs that do not use them stay what they were.
    thinking: bool = pydantic.Field(default=False, exclude_if=lambda value: value is False)
    """The model reasons before a ``</think>`` marker: graders read only the answer after it, and an
    output without the marker has no answer."""
    chat_template_args: dict[str, Any] = pydantic.Field(
        default_factory=dict, exclude_if=lambda value: not value
    )
    """Extra arguments of the tokenizer's chat template (Qwen3: ``enable_thinking: true``)."""

    def __hash__(self) -> int:  # a spec is a key of the runner's groupings; its dict field is not hashable
        return hash(self.model_dump_json())


def model_names() -> list[str]:
    return spec_names("models")


def load_model_spec(name_or_path: str | Path) -> ModelSpec:
    """A built-in model by name (``kvbench list models``) or a user's model YAML by path."""
    return load_spec(find_spec_file("model", "models", str(name_or_path)), ModelSpec)
