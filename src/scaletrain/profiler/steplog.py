"""The per-step records of one rank: metrics-rank{r}.jsonl (docs/metrics.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class StepLog:
    """Appends one JSON line per step to this rank's metrics file, each written through at once (one
    write call, no fsync: about 10 us): `scaletrain watch` sees every step as it ends, and a worker killed
    by a signal leaves every step it finished on record (what a restart replays is counted from them)."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", buffering=1 << 16)

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
