"""A long phase that is not training (measuring block costs, calibrating, tracing a model, predicting): on a
terminal a transient bar; in a log a line as it starts, lines at the pace of pace.py as it goes, one as it ends:

    pipeline split: measuring 12 blocks' costs (3 rounds, micro-batch 8) ...
    pipeline split: measuring 12 blocks' costs (3 rounds, micro-batch 8): 1/36 (layer1), 0:00:04 elapsed, ETA 0:02:20
    pipeline split: measuring 12 blocks' costs (3 rounds, micro-batch 8): done in 0:01:58

Work reports through the callback `update(label, done, total)` (calibrate.py's `progress`, costs.py's)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Callable

from rich.console import Console

from scaletrain.console.pace import Pace
from scaletrain import fmt

Update = Callable[[str, int, "int | None"], None]


def write_line(text: str) -> None:
    print(text, flush=True)  # flushed: a log is read while the job runs


class PhaseLines:
    """The phase's lines: one now, then each `update` that the pace lets through, and `end`'s."""

    def __init__(self, what: str, *, eta: bool = True, write: Callable[[str], None] = write_line,
                 pace: Pace | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """`eta`: the units take about as long as each other, so the time left can be told from the count."""
        self.what, self.eta, self.write, self.clock = what, eta, write, clock
        self.pace = pace or Pace(clock=clock)
        self.start = clock()
        write(f"{what} ...")

    def update(self, label: str, done: int, total: int | None = None) -> None:
        if done < 1 or not self.pace.due(done):  # (a count of 0 says the total: the start line has said enough)
            return
        elapsed = self.clock() - self.start
        count = f"{done}/{total}" if total else str(done)
        about = f" ({label})" if label else ""
        eta = f", ETA {fmt.hms(elapsed / done * (total - done))}" if self.eta and total and done else ""
        self.write(f"{self.what}: {count}{about}, {fmt.hms(elapsed)} elapsed{eta}")

    def end(self) -> None:
        self.write(f"{self.what}: done in {fmt.hms(self.clock() - self.start)}")


@contextlib.contextmanager
def phase(what: str, *, eta: bool = True, console: Console | None = None) -> Iterator[Update]:
    """`with phase("calibrate") as update: work(progress=update)`: a bar on a terminal, PhaseLines elsewhere
    (no `done` line when the work raises: its error says why it ended)."""
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console()
    if not console.is_terminal:
        lines = PhaseLines(what, eta=eta)
        yield lines.update
        lines.end()
        return
    with Progress(TextColumn(escape(what)), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("", total=None)
        yield lambda label, done, total=None: bar.update(task, description=escape(label), completed=done,
                                                         total=total)
