"""The training loop's console: rank 0's progress (a bar on a terminal, plain lines in a log) and one line per
epoch (a sink the loop is handed)."""

from __future__ import annotations

from typing import Any

from scaletrain.console.progress import SilentBar, progress_for
from scaletrain.console.summary import epoch_line


class ConsoleSink:
    """Sink protocol of train/loop.py: epoch_start, step, epoch_end (rank 0's epoch records), close.
    `replicas`: the data-parallel replicas that share the global batch (a step's samples are rank 0's);
    `progress` False (--no-progress): the epoch lines alone; `bar`: what shows progress (default: progress_for)."""

    def __init__(self, epochs: int, replicas: int, progress: bool = True, bar: SilentBar | None = None) -> None:
        self.epochs, self.replicas = epochs, replicas
        self.bar = bar or (progress_for() if progress else SilentBar())

    def epoch_start(self, epoch: int, epochs: int, steps: int, done: int = 0) -> None:
        self.bar.start_epoch(epoch, epochs, steps, done)

    def step(self, record: dict[str, Any]) -> None:
        self.bar.step(record["loss"], record["samples"] * self.replicas, record["step_time_s"])

    def epoch_end(self, record: dict[str, Any]) -> None:
        self.bar.end_epoch()
        print(epoch_line(record, self.epochs), flush=True)

    def close(self) -> None:
        self.bar.close()
