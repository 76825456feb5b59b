"""Analyses of what a model caches (``kvbench analyze``): value-state statistics and their figures."""
