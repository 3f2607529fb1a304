"""Rank 0's training progress: a bar on a terminal, plain lines in a log (a SLURM job's output, `nohup`, a
pipe); other ranks and --no-progress get a silent one. Each is fed (loss, samples, seconds) per step."""

from __future__ import annotations

from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from scaletrain.console.pace import Pace
from scaletrain.console.phase import write_line
from scaletrain import fmt


class SilentBar:
    def start_epoch(self, epoch: int, epochs: int, steps: int, done: int = 0) -> None: ...
    def step(self, loss: float, samples: int, seconds: float) -> None: ...
    def end_epoch(self) -> None: ...
    def close(self) -> None: ...


def progress_for(console: Console | None = None) -> SilentBar:
    """The bar when `console` (default: stderr, where the bar draws) is a terminal, else plain lines."""
    console = console or Console(stderr=True)
    return EpochBar(console) if console.is_terminal else PlainLines()


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

    def step(self, loss: float, samples: int, seconds: float) -> None:
        rate = fmt.number(samples / seconds) if seconds > 0 else "-"
        self.progress.update(self.task, advance=1, loss=f"{loss:.4f}", rate=rate)

    def end_epoch(self) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None

    def close(self) -> None:
        self.progress.stop()


class PlainLines(SilentBar):
    """A line on the first step, then at pace.py's pace (steps counted over the whole invocation; the sink's
    epoch line counts as one):

        epoch 1/3  step 120/400  loss 0.8123  1,234 samples/s  ETA 0:02:05

    samples/s over the steps since the last line (their recorded step times), and the ETA of the epoch's
    training at that rate (evaluation not included)."""

    def __init__(self, write: Callable[[str], None] = write_line, pace: Pace | None = None) -> None:
        self.write, self.pace = write, pace or Pace()
        self.steps_run = 0  # by this invocation, over its epochs: what the pace counts
        self.epoch = self.epochs = self.steps = self.at = 0
        self.samples, self.seconds, self.since = 0, 0.0, 0

    def start_epoch(self, epoch: int, epochs: int, steps: int, done: int = 0) -> None:
        self.epoch, self.epochs, self.steps, self.at = epoch, epochs, steps, done
        self.samples, self.seconds, self.since = 0, 0.0, 0

    def step(self, loss: float, samples: int, seconds: float) -> None:
        self.at += 1
        self.steps_run += 1
        self.samples, self.seconds, self.since = self.samples + samples, self.seconds + seconds, self.since + 1
        if not self.pace.due(self.steps_run):
            return
        rate = self.samples / self.seconds if self.seconds > 0 else None
        left = (self.steps - self.at) * self.seconds / self.since if self.seconds > 0 else None
        self.write(f"epoch {self.epoch + 1}/{self.epochs}  step {self.at}/{self.steps}  loss {loss:.4f}  "
                   f"{fmt.rate(rate, 'samples')}  ETA {fmt.hms(left)}")
        self.samples, self.seconds, self.since = 0, 0.0, 0

    def end_epoch(self) -> None:
        self.pace.wrote(self.steps_run)  # the sink writes the epoch's line next
