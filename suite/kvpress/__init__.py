"""NVIDIA kvpress presses as kvbench entrants (``--policy kvpress:KnormPress[:key=value,...]``).

kvpress pins its own transformers and pandas and patches transformers' attention functions when it is
imported, so it never enters kvbench's process: a press scores in a child process whose interpreter is
the separate environment ``make kvpress-venv`` builds (kvbench.kvpress.child), over the isolated scorer's
wire (kvbench.isolation.wire and messages). The engine keeps the schedule; the press only scores.
"""
