"""The training loop's console: rank 0's progress bar and one line per epoch (a sink the loop is handed)."""

from __future__ import annotations

from typing import Any

from scaletrain.console.progress import EpochBar, SilentBar
from scaletrain.console.summary import epoch_line


class ConsoleSink:
    """Sink protocol of train/loop.py: epoch_start, step, epoch_end (rank 0's epoch records), close."""

    def __init__(self, epochs: int, world_size: int, bar: bool = True) -> None:
        self.epochs, self.world_size = epochs, world_size
        self.bar = EpochBar() if bar else SilentBar()

    def epoch_start(self, epoch: int, epochs: int, steps: int, done: int = 0) -> None:
        self.bar.start_epoch(epoch, epochs, steps, done)

    def step(self, record: dict[str, Any]) -> None:
        seconds = record["step_time_s"]
        self.bar.step(record["loss"], record["samples"] * self.world_size / seconds if seconds > 0 else None)

    def epoch_end(self, record: dict[str, Any]) -> None:
        self.bar.end_epoch()
        print(epoch_line(record, self.epochs), flush=True)

    def close(self) -> None:
        self.bar.close()
