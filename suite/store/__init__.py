"""How results are written and read: atomic writes, the record, shard and manifest formats, ingest."""
