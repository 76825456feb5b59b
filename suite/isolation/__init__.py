"""Submitted scorers in a process of their own, behind the bubblewrap boundary.

The parent (kvbench.isolation.host) decodes, grades and stores; the child (kvbench.isolation.child)
imports the scorer file and answers one request per eviction event or observed step
(kvbench.isolation.wire). The parent never imports the scorer's file.
"""
