"""When a progress line is due in a log (console/pace.py), on a stand-in clock: no real time passes."""

from __future__ import annotations

from scaletrain.console.pace import Pace


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def lines(pace: Pace, clock: Clock, units: int, seconds_each: float) -> list[int]:
    """The units after which a line was due, each unit taking `seconds_each`."""
    due = []
    for n in range(1, units + 1):
        clock.t += seconds_each
        if pace.due(n):
            due.append(n)
    return due


def test_the_first_unit_then_every_n_units():
    clock = Clock()
    assert lines(Pace(every=10, least_s=5, most_s=30, clock=clock), clock, 40, 1.0) == [1, 11, 21, 31]


def test_quick_units_are_held_to_one_line_per_least_s():
    clock = Clock()  # 10 units take 1 s: every 10 units would be a line a second
    assert lines(Pace(every=10, least_s=5, most_s=30, clock=clock), clock, 160, 0.1) == [1, 51, 101, 151]


def test_slow_units_still_give_a_line_every_most_s():
    clock = Clock()  # a unit of 20 s: 10 units would be 200 s of silence
    assert lines(Pace(every=10, least_s=5, most_s=30, clock=clock), clock, 7, 20.0) == [1, 3, 5, 7]


def test_a_line_written_elsewhere_restarts_the_count():
    clock = Clock()
    pace = Pace(every=10, least_s=5, most_s=30, clock=clock)
    assert lines(pace, clock, 5, 1.0) == [1]
    clock.t += 25
    pace.wrote(5)  # the caller's own line (an epoch's): 30 s after the first, none is due by time now
    assert pace.lines == 2 and not pace.due(6)
    clock.t += 29
    assert not pace.due(7)
    clock.t += 1
    assert pace.due(8)
