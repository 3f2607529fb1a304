"""Per-step records and the throughput computed from them (pure functions; no printing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable


class StepLog:
    """Appends one JSON line per step to this rank's metrics file; flushed once per epoch, not per step."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", buffering=1 << 16)

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


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
