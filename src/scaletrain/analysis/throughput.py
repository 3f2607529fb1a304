"""Steady-state throughput from per-step records (pure functions; no printing)."""

from __future__ import annotations

from typing import Any, Iterable


def warmup_steps(steps_per_epoch: int) -> int:
    """Steps at the start of each epoch left out of steady-state throughput (loader start, allocator)."""
    return min(5, steps_per_epoch // 4)


def steady_samples_per_s(records: Iterable[dict[str, Any]], world_size: int, steps_per_epoch: int) -> float | None:
    """Global training samples per second over steady-state steps: sum(samples) x world / sum(step time).

    Uses one rank's records (every rank waits for the slowest in the gradient all-reduce, so step times
    agree across ranks). Returns None when no steady-state step exists (say so; never report 0).
    """
    skip = warmup_steps(steps_per_epoch)
    steady = [r for r in records if r["step_in_epoch"] >= skip]
    seconds = sum(r["step_time_s"] for r in steady)
    if not steady or seconds <= 0:
        return None
    return sum(r["samples"] for r in steady) * world_size / seconds
