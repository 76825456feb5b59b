"""The hf adapter's tokens for the vLLM parity case, kept in a fixture that the vLLM venv's tests read.

vLLM's venv cannot run the hf adapter (it pins transformers below the cache API the hf adapter needs), so
the comparison goes through a file: this test, in the main venv, fails if the file is not exactly what
the hf adapter decodes today. Rewrite it with ``python tests/adapters/vllm_backend/test_golden_tokens.py``.
"""

from __future__ import annotations

import json

import pytest
from parity import GOLDEN, MODEL, decode_all, golden

from kvbench.adapters.base import find_adapter
from kvbench.specs.model import load_model_spec

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in transformers.__version__.split(".")[:2]) < (5, 20),
    reason="the hf adapter needs transformers >= 5.20 (this is vLLM's venv): the main venv runs this test",
)


def hf_tokens() -> dict:
    backend = find_adapter("hf").load(load_model_spec(MODEL), device="cpu", attention="sdpa", progress=False)
    return decode_all(backend)


def test_golden_tokens_are_what_the_hf_adapter_decodes() -> None:
    assert GOLDEN.is_file(), f"{GOLDEN} is missing: python {__file__}"
    decoded = hf_tokens()
    assert decoded == golden(), f"the hf adapter's tokens changed: python {__file__} rewrites {GOLDEN.name}"
    assert all(s["evictions"] == 30 for name, samples in decoded.items() if name != "full" for s in samples)


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps({"model": MODEL, "samples": hf_tokens()}) + "\n")
    print(f"wrote {GOLDEN}")
