"""Benchmarks: speed is measured side by side in one process and reported as ratios."""
