"""When a progress line is due in a log (a SLURM job's output, `nohup`, a pipe): pure, on any clock.

A terminal redraws a bar in place; a log keeps every line, so lines come at a bounded rate instead:

    unit done:   1   2 ... 100 ... 250 ...            (steps, measurements, points)
    line:        *         *       *                  the first unit; then `every` units, but never within
                                                      `least_s` of the last line; and at the latest `most_s`
                                                      after it (slow units: a minutes-long epoch is never silent)
"""

from __future__ import annotations

import time
from typing import Callable

EVERY = 100
LEAST_S = 10.0
MOST_S = 30.0


class Pace:
    """Say whether a line is due each time a unit of work is done; `clock` (seconds) is injectable for tests."""

    def __init__(self, every: int = EVERY, least_s: float = LEAST_S, most_s: float = MOST_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.least_s, self.most_s, self.clock = every, least_s, most_s, clock
        self.lines = 0
        self._done, self._at = 0, clock()

    def due(self, done: int) -> bool:
        """Whether to write a line now that `done` units are done; a due line counts as written."""
        now = self.clock()
        quiet = now - self._at
        if self.lines == 0 or quiet >= self.most_s or (done - self._done >= self.every and quiet >= self.least_s):
            self.wrote(done, now)
            return True
        return False

    def wrote(self, done: int, now: float | None = None) -> None:
        """A line was written at `done` units (one of the caller's own, such as an epoch's line): the next
        line is counted from here."""
        self.lines += 1
        self._done, self._at = done, self.clock() if now is None else now
