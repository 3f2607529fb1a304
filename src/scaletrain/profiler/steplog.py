"""The per-step records of one rank: metrics-rank{r}.jsonl (docs/metrics.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaletrain.rundir import JsonlAppender


class StepLog:
    """Appends one JSON line per step to this rank's metrics file, each written through at once (one
    write call, no fsync: about 10 us): `scaletrain watch` sees every step as it ends, and a worker killed
    by a signal leaves every step it finished on record (what a restart replays is counted from them)."""

    def __init__(self, path: Path) -> None:
        self._out = JsonlAppender(path)

    def write(self, record: dict[str, Any]) -> None:
        self._out.write(record)

    def flush(self) -> None:
        """Nothing to do: every line is written as it comes."""

    def close(self) -> None:
        self._out.close()
