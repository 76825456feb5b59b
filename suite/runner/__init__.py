"""The runner: plans cells and units from specs, runs what is not stored yet, writes shards, ingests."""
