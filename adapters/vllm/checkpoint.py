"""A model spec as a checkpoint folder vLLM can load, plus kvbench's tokenizer and model facts.

kvbench's hf loader already knows every source kind (hub checkpoints, the GGUF package it converts
once, the seeded random Qwen3); this reuses it and hands vLLM the folder: the hub's or converted one
as it is, a random model saved once under kvbench's cache.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kvbench.specs.model import GgufPackage, HubCheckpoint, ModelSpec


def materialize(spec: ModelSpec) -> tuple[Any, Path]:
    from kvbench.adapters.hf.models import load_model, save_checkpoint
    from kvbench.cache_folder import cache_root

    loaded = load_model(spec, device="cpu", attention="sdpa")
    source = spec.source
    if isinstance(source, GgufPackage):
        return loaded, Path(loaded.provenance["converted"])
    if isinstance(source, HubCheckpoint) and Path(source.repo).expanduser().is_dir():
        return loaded, Path(source.repo).expanduser()
    if isinstance(source, HubCheckpoint):
        return loaded, Path(_hub_snapshot(source.repo, source.revision))
    digest = hashlib.sha256(json.dumps(source.model_dump(), sort_keys=True).encode()).hexdigest()[:16]
    target = cache_root() / "models" / f"{spec.name}-{digest}-{spec.dtype}"
    if not (target / "config.json").is_file():
        save_checkpoint(target, loaded.model)
    return loaded, target


def _hub_snapshot(repo: str, revision: str) -> str:
    from huggingface_hub import snapshot_download

    return snapshot_download(repo, revision=revision, local_files_only=True)
