"""The oracle: kvpress's own DecodingPress generating on the embedded model against kvbench's engine under
the schedule that matches it, greedy, over 224 tokens with 6 compressions.

The mapping (docs/kvpress.md): DecodingPress(interval I, target T) compresses a layer's cache after every
I decoded tokens, to T tokens, when it holds more; kvbench evicts after a step when the length L > K and
(L - K) is a multiple of B, down to K. With B = I, K = T, nothing protected, and K = P + B for a prompt of
P tokens (so that (P - K) is a multiple of B), both compress at the same steps, from K + B tokens to K.
They differ in what may go: kvpress's press scores all K + B tokens, kvbench's only the K candidates (the
B most recent tokens are never candidates). StreamingLLM keeps the same tokens either way (its sinks and
its most recent ones); KNorm may not, and then the first divergence is shown.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvpress_support import kvpress_python, run_press_side

from kvbench.adapters.base import Sampling, ended, find_adapter
from kvbench.core.schedule import Schedule
from kvbench.kvpress.policy import kvpress_policy
from kvbench.specs.model import load_model_spec

PROMPT = "Explain step by step why the sky is blue, then list three other examples of light scattering."
BUFFER, NEW_TOKENS = 32, 200


def kvbench_tokens(press: str) -> tuple[list[int], int, list[int], str]:
    """kvbench's greedy tokens with the press scoring, its eviction events, the prompt and the checkpoint."""
    spec = load_model_spec("smollm2-135m")
    policy = kvpress_policy(f"kvpress:{press}")
    try:
        with ended(find_adapter("hf").load(spec, device="cpu", attention="sdpa")) as backend:
            ids = backend.prompt_ids(PROMPT)
            result = backend.generate(
                ids,
                policy,
                Schedule(budget=len(ids) + BUFFER, buffer=BUFFER, protection="none"),
                sample_seeds=[0],
                sampling=Sampling(0.0, 1.0, 0),
                max_new_tokens=NEW_TOKENS,
                ignore_stop=True,
            )
            checkpoint = backend.loaded.provenance["converted"]
    finally:
        policy.close()
    sample = result.samples[0]
    return sample.tokens, sample.evictions, ids, checkpoint


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


# kvpress's compress() as it is; for StreamingLLM also kept in slot order, kvbench's compaction order
MODES = {"StreamingLLMPress": ("kvpress", "chronological"), "KnormPress": ("kvpress",)}


@pytest.mark.slow
@pytest.mark.parametrize("press", list(MODES))
def test_decoding_press_against_kvbench_under_the_matching_schedule(press: str, tmp_path: Path) -> None:
    kvpress_python()
    tokens, evictions, ids, checkpoint = kvbench_tokens(press)
    budget = len(ids) + BUFFER
    ids_file, out = tmp_path / "ids.json", tmp_path / "oracle.json"
    ids_file.write_text(json.dumps(ids))
    run_press_side(
        "oracle_side.py", checkpoint, ids_file, press, BUFFER, budget, NEW_TOKENS, out, *MODES[press]
    )
    oracle = json.loads(out.read_text())
    first_event = budget + BUFFER - len(ids)  # generated tokens when the cache first reaches K + B
    parted = {}
    for mode in MODES[press]:
        theirs = oracle[mode]
        # the schedules match: as many compressions, each down to K
        assert evictions == len(theirs["compressed_to"]) >= 3, mode
        assert set(theirs["compressed_to"]) == {budget}, mode
        assert len(tokens) == len(theirs["tokens"]) == NEW_TOKENS
        parted[mode] = first_difference(tokens, theirs["tokens"])
        # the same model in two transformers releases: identical until the first compression
        assert parted[mode] is None or parted[mode] > first_event, (mode, parted[mode])
    dropped = oracle["kvpress"]["recent_dropped"]
    print(f"{press}: {NEW_TOKENS} tokens, {evictions} compressions; first divergence {parted}; {dropped}")
    if press == "StreamingLLMPress":
        # kvpress keeps the B most recent tokens too, so the kept tokens are the same; kept in slot order,
        # as kvbench compacts, the text is identical (kvpress's score order only reorders the sums)
        assert dropped == [0] * evictions
        assert parted["chronological"] is None, parted
    else:
        # KNorm: kvpress drops some of the B most recent tokens, which kvbench never evicts, at the first
        # compression already: the texts part after it
        assert dropped[0] > 0 and parted["kvpress"] is not None, (dropped, parted)
