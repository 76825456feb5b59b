"""Built-in eviction policies, one file each; drop your own scorer here (``kvbench new-policy NAME``).

Every public module is scanned for classes decorated with ``@kvbench.policy``; ``scoring`` holds the
helpers that several policies share. Each policy file's docstring gives its exact math and source;
docs/policies.md states them all, and docs/scorers.md lists them.
"""
