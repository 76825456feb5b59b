"""Declarative specs: models, protocols, suites and tasks, loaded from YAML and validated by pydantic."""
