"""The store: how results are written and read back (atomic writes, the record, shard and manifest
formats, ingest into DuckDB). It sits just above kvbench.specs and knows nothing of the runner or readers."""
