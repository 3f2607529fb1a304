"""Gradient aggregation: compressors, compressed DDP hooks, the ring all-reduce (see docs/strategies.md)."""
