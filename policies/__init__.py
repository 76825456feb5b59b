"""Built-in eviction policies, one file each; drop your own scorer here (``kvbench new-policy NAME``).

Every public module is scanned for classes decorated with ``@kvbench.policy``; ``scoring`` holds the
helpers that several policies share. POLICIES.md in the design notes gives each policy's exact math.
"""
