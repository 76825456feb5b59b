"""The engine core: the policy contract, the eviction schedule and engine, per-layer slots, seeding, RoPE."""
