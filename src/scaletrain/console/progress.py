"""Rank 0's progress bar (steps, loss, samples/s, ETA); other ranks and --no-progress get a silent one."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class SilentBar:
    def start_epoch(self, epoch: int, epochs: int, steps: int, done: int = 0) -> None: ...
    def step(self, loss: float, samples_per_s: float | None) -> None: ...
    def end_epoch(self) -> None: ...
    def close(self) -> None: ...


class EpochBar(SilentBar):
    """One bar per epoch; rich redraws it from its own thread at a fixed rate, so a step costs one update."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]} samples/s"),
            TextColumn("ETA"), TimeRemainingColumn(), console=self.console, transient=True,
        )
        self.progress.start()
        self.task = None

    def start_epoch(self, epoch: int, epochs: int, steps: int, done: int = 0) -> None:
        """`done`: steps of this epoch already trained (a run resumed mid-epoch)."""
        self.task = self.progress.add_task(f"epoch {epoch + 1}/{epochs}", total=steps, completed=done,
                                           loss="-", rate="-")

    def step(self, loss: float, samples_per_s: float | None) -> None:
        rate = f"{samples_per_s:,.0f}" if samples_per_s else "-"
        self.progress.update(self.task, advance=1, loss=f"{loss:.4f}", rate=rate)

    def end_epoch(self) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None

    def close(self) -> None:
        self.progress.stop()
