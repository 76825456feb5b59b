"""Task specs (one YAML per task), shipped as package data of ``kvbench.tasks``."""
