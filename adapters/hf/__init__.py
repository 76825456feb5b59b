"""The transformers backend: policies evicting inside real Hugging Face models.

- ``models``: load a model spec (GGUF package, hub checkpoint, seeded random Qwen3) into a model,
  a tokenizer and the facts a policy may know;
- ``attention``: the registered attention functions that record queries for the policies;
- ``cache``: the evicting ``transformers`` Cache;
- ``decode``: kvbench's own decode loop (batched samples, seeded sampling, rows leaving at EOS);
- ``teacher``: teacher-forced scoring through the same eviction path, B tokens per forward.
"""
