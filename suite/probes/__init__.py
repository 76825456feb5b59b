"""Synthetic probes (passkey, planted-fact, fidelity): seeded generators, no downloads, no test set."""
