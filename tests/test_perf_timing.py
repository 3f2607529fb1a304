"""perf/timing.py, the one way a measurement is repeated: how many calls `samples` makes and when it stops."""

from __future__ import annotations

import itertools

from scaletrain.perf.timing import samples


def test_samples_makes_least_then_stops_at_most_when_the_budget_is_long():
    calls = itertools.count()
    out = samples(lambda: next(calls), least=2, seconds=60.0, most=5, warmup=3)
    assert out == [3, 4, 5, 6, 7]  # 3 untimed warm-up calls, then at most 5


def test_samples_without_a_budget_makes_exactly_least():
    assert len(samples(lambda: 0.0, least=4)) == 4


def test_enough_decides_instead_of_the_clock_after_each_call_past_least():
    asked: list[int] = []

    def enough(so_far: list[float]) -> bool:  # what two sides of a link agree on in doctor
        asked.append(len(so_far))
        return sum(so_far) >= 3.0

    out = samples(lambda: 1.0, least=2, most=10, enough=enough)
    assert out == [1.0, 1.0, 1.0] and asked == [2, 3]
    assert samples(lambda: 1.0, least=1, most=2, enough=lambda _: False) == [1.0, 1.0]  # most still bounds it

