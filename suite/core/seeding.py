"""Stable seeds: every random draw in kvbench derives from named integers through a fixed hash.

Python's ``hash`` is salted per process, so it would give different draws on every run; blake2b does not.
"""

from __future__ import annotations

import hashlib

import torch

_SEED_BITS = 63  # torch.Generator.manual_seed accepts any non-negative int64


def stable_seed(*parts: int | str) -> int:
    """A 63-bit seed from an ordered tuple of ints and strings, identical across processes and machines."""
    text = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts)
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - _SEED_BITS)


def sample_seed(protocol_seed: int, task: str, problem: str, sample: int) -> int:
    """The seed of one sample: drives its token sampling and every eviction draw made for it."""
    return stable_seed("sample", protocol_seed, task, problem, sample)


def eviction_seed(row_seed: int, layer: int, event: int) -> int:
    """The seed of one row's draws at one eviction event of one layer."""
    return stable_seed("evict", row_seed, layer, event)


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch.Generator on ``device`` seeded with ``seed``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen
