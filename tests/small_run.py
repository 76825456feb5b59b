"""The smallest real `kvbench run` (the ``small_results`` fixture in conftest.py writes it once per test
run): one passkey problem, one sample, streaming against the null and the full cache on the seeded tiny
Qwen3 (three runs, three shards)."""

SMALL_RUN = [
    *("run", "--model", "tiny-qwen3", "--task", "passkey", "--policy", "streaming"),
    *("--limit", "1", "--samples", "1", "--quiet"),
]
