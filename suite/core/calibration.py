"""Query statistics for TriAttention, made by ``kvbench calibrate`` and keyed by model.

For every layer and query head, over the tokens of a calibration corpus (never a test set), with the
pre-RoPE query (after q_norm where the model has one) split into complex RoPE bands
z_f = q[f] + i·q[f + D/2] (rotate-half layout):
- q̄_f = mean of z_f (complex), stored as real and imaginary parts;
- m_f = mean of |z_f|.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from kvbench.errors import PrerequisiteError

FORMAT_VERSION = 1


def complex_bands(x: Tensor) -> Tensor:
    """[..., D] real -> [..., D/2] complex with z_f = x[f] + i·x[f + D/2]."""
    half = x.shape[-1] // 2
    return torch.complex(x[..., :half].float(), x[..., half:].float())


@dataclass(frozen=True)
class QueryStats:
    model: str
    corpus: str
    tokens: int
    mean: Tensor
    """[L, Hq, D/2] complex: q̄_f per layer and query head."""
    mean_abs: Tensor
    """[L, Hq, D/2] float32: m_f per layer and query head."""

    @classmethod
    def from_queries(cls, model: str, corpus: str, queries: Sequence[Tensor]) -> QueryStats:
        """From per-layer pre-RoPE queries, each [Hq, T, D] (T tokens)."""
        bands = [complex_bands(q) for q in queries]  # each [Hq, T, D/2]
        return cls(
            model=model,
            corpus=corpus,
            tokens=int(queries[0].shape[1]),
            mean=torch.stack([z.mean(dim=1) for z in bands]),
            mean_abs=torch.stack([z.abs().mean(dim=1) for z in bands]),
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {
            "mean_real": self.mean.real.contiguous(),
            "mean_imag": self.mean.imag.contiguous(),
            "mean_abs": self.mean_abs.contiguous(),
        }
        meta = {
            "format": str(FORMAT_VERSION),
            "model": self.model,
            "corpus": self.corpus,
            "tokens": str(self.tokens),
        }
        save_file(tensors, str(path), metadata=meta)

    @classmethod
    def load(cls, path: Path, model: str | None = None) -> QueryStats:
        if not path.is_file():
            raise PrerequisiteError(
                f"no calibration statistics at {path}: "
                f"run `kvbench calibrate --model {model or 'MODEL'}` first"
            )
        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
        if model is not None and meta.get("model") != model:
            raise PrerequisiteError(
                f"{path} holds statistics for model {meta.get('model')!r}, not {model!r}: "
                f"run `kvbench calibrate --model {model}`"
            )
        tensors = load_file(str(path))
        return cls(
            model=meta.get("model", ""),
            corpus=meta.get("corpus", ""),
            tokens=int(meta.get("tokens", 0)),
            mean=torch.complex(tensors["mean_real"], tensors["mean_imag"]),
            mean_abs=tensors["mean_abs"],
        )


def default_path(model: str, root: Path = Path("runs/calibration")) -> Path:
    """Where ``kvbench calibrate`` writes a model's statistics by default."""
    return root / f"{model}.safetensors"
