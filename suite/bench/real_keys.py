"""Keys and values a real model makes, for ``kvbench bench evict``: the cost of a policy whose work depends
on what the keys hold (R-KV's near-duplicate search stops at a row's first match) differs between random
draws, where no key has a near-duplicate, and the keys a run meets.

They are captured once from the embedded model (SmolLM2-135M) on the fidelity probe's trace (the
reasoning-like text `make run` scores), one forward pass, and kept in kvbench's cache folder. SmolLM2 has
3 KV heads of dim 64 per layer: a bench head of dim 128 joins two heads of one layer (the same tokens,
both rotated as the model rotates them), and the bench's KV heads are taken from layers spread over the
depth, so each holds a different layer's structure.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch
from torch import Tensor

MODEL = "smollm2-135m"
SOURCE_DIM, SOURCE_HEADS, SOURCE_LAYERS, SOURCE_POSITIONS = 64, 3, 30, 8192
CAPTURE_VERSION = 1
"""Bump when what is captured changes: it names the cached file."""


@dataclass(frozen=True)
class RealKeys:
    keys: Tensor
    """[Hkv, T, D], rotated at positions 0..T-1."""
    values: Tensor
    """[Hkv, T, D]."""
    description: str


def fits(kv_heads: int, head_dim: int, tokens: int) -> str:
    """Why real keys cannot be had at this shape ('' when they can)."""
    if head_dim % SOURCE_DIM or head_dim // SOURCE_DIM > SOURCE_HEADS:
        return (
            f"head dim {head_dim}: real keys join {MODEL}'s heads of dim {SOURCE_DIM}, up to {SOURCE_HEADS}"
        )
    if kv_heads > SOURCE_LAYERS:
        return f"{kv_heads} KV heads: real keys take one per layer of {MODEL}'s {SOURCE_LAYERS}"
    if tokens > SOURCE_POSITIONS:
        return f"{tokens} tokens: more than {MODEL}'s {SOURCE_POSITIONS} positions"
    return ""


def captured(kv_heads: int, head_dim: int, tokens: int) -> RealKeys:
    """``tokens`` tokens' keys and values at the bench's shape, from the cache folder or made now (a forward
    pass of the embedded model: about half a minute for 4,000 tokens on 2 cores)."""
    from kvbench.cache_folder import cache_root

    name = f"{MODEL}-fidelity-{tokens}-{kv_heads}x{head_dim}-v{CAPTURE_VERSION}"
    path = cache_root() / "bench-keys" / f"{hashlib.sha256(name.encode()).hexdigest()[:16]}.pt"
    described = (
        f"{MODEL}'s keys on the fidelity probe's trace ({tokens} tokens; each head of dim {head_dim} joins "
        f"{head_dim // SOURCE_DIM} of one layer's heads, {kv_heads} layers)"
    )
    if path.exists():
        held = torch.load(path, weights_only=True)
        return RealKeys(held["keys"], held["values"], described)
    keys, values = _capture(kv_heads, head_dim, tokens)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save({"keys": keys, "values": values}, temporary)
    temporary.replace(path)
    return RealKeys(keys, values, described)


def _capture(kv_heads: int, head_dim: int, tokens: int) -> tuple[Tensor, Tensor]:
    from kvbench.adapters.hf.models import load_model
    from kvbench.probes.problems import fidelity_problem

    loaded = load_model(MODEL, progress=False)
    tokenizer = loaded.tokenizer

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    trace = fidelity_problem(0, seed=0, length=tokens + 64, count_tokens=count)
    text = "".join(piece.text for piece in trace.pieces)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][:, :tokens]
    loaded.model.set_attn_implementation("sdpa")  # a plain forward pass: no eviction, no kvbench cache
    with torch.inference_mode():
        cache = loaded.model(ids, use_cache=True).cache
    joined = head_dim // SOURCE_DIM
    layers = torch.linspace(0, SOURCE_LAYERS - 1, kv_heads).round().long().tolist()
    picked = [
        [(index + part) % SOURCE_HEADS for part in range(joined)] for index in range(kv_heads)
    ]  # a different first head from layer to layer
    chosen = list(zip(layers, picked, strict=True))
    keys = torch.stack([cache.layers[at].keys[0, heads].permute(1, 0, 2).flatten(1) for at, heads in chosen])
    values = torch.stack(
        [cache.layers[at].values[0, heads].permute(1, 0, 2).flatten(1) for at, heads in chosen]
    )
    return keys.float().contiguous(), values.float().contiguous()


def _joined(tensor: Tensor, heads: list[int]) -> Tensor:
    """[1, H, T, d] → [T, len(heads) × d]: the heads' vectors of each token side by side."""
    return tensor[0, heads].permute(1, 0, 2).flatten(1)
