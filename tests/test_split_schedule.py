"""The pipeline schedule played op by op (split/schedule.py): the orders torch.distributed.pipelining runs,
a step played by hand, the closed form where it holds, and the lower bound under every step."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaletrain.split.schedule import lower_bound, order, step_time


def test_orders_follow_torch_pipelining():
    # Schedule1F1B: stage s warms up with min(M, K - s) forwards, then one backward and one forward in turn
    assert order("1f1b", 0, 2, 4) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    assert order("1f1b", 1, 2, 4) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    assert order("1f1b", 0, 4, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert order("gpipe", 1, 3, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    with pytest.raises(ValueError, match="schedule"):
        order("zb", 0, 2, 2)


def test_a_forward_heavy_stage_beside_a_backward_heavy_one_played_by_hand():
    # ResNet-20's uniform split at M = 2 (ms per micro-batch): stage 0 F 18.6 B 23.2, stage 1 F 9.1 B 14.1.
    # 1F1B: s0 F0 0-18.6, F1 -37.2; s1 F0 18.6-27.7, B0 -41.8; s0 B0 41.8-65.0; s1 F1 41.8-50.9, B1 -65.0;
    # s0 B1 65.0-88.2. The closed form sum + (M - 1) max says 41.8 + 23.2 + 41.8 = 106.8
    assert step_time([18.6, 9.1], [23.2, 14.1], "1f1b", 2) == pytest.approx(88.2)
    # GPipe: s1 runs F1 (37.2-46.3) before B0 (-60.4), B1 -74.5; s0 B0 60.4-83.6, B1 83.6-106.8
    assert step_time([18.6, 9.1], [23.2, 14.1], "gpipe", 2) == pytest.approx(106.8)


durations = st.floats(0.01, 10)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.integers(1, 8), st.sampled_from(["gpipe", "1f1b"]), durations, durations)
def test_equal_stages_take_the_closed_form(k, m, schedule, f, b):
    assert step_time([f] * k, [b] * k, schedule, m) == pytest.approx((m + k - 1) * (f + b))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(durations, durations), min_size=1, max_size=5), st.integers(1, 8),
       st.sampled_from(["gpipe", "1f1b"]))
def test_no_step_beats_its_lower_bound_nor_exceeds_running_one_op_at_a_time(stages, m, schedule):
    fwd, bwd = [f for f, _ in stages], [b for _, b in stages]
    step = step_time(fwd, bwd, schedule, m)
    assert lower_bound(fwd, bwd, m) <= step * (1 + 1e-9)
    assert lower_bound(fwd[:1], bwd[:1], m) <= step * (1 + 1e-9)  # over the first stages alone too
    assert step <= m * (sum(fwd) + sum(bwd)) * (1 + 1e-9)  # never worse than no overlap at all


def _played_by_events(forward, backward, schedule, m):
    """The step as a discrete-event play: repeatedly start, over all stages, the next op whose input is done (the
    earliest start first), independent of the order split/schedule.py keeps."""
    k = len(forward)
    plans = [order(schedule, s, k, m) for s in range(k)]
    done, free, nxt = {}, [0.0] * k, [0] * k
    while any(nxt[s] < len(plans[s]) for s in range(k)):
        ready = []
        for s in range(k):
            if nxt[s] < len(plans[s]):
                kind, i = plans[s][nxt[s]]
                dep = (("F", s - 1, i) if s > 0 else None) if kind == "F" else \
                    (("B", s + 1, i) if s < k - 1 else ("F", s, i))
                if dep is None or dep in done:
                    ready.append((max(free[s], done[dep] if dep else 0.0), s, kind, i))
        start, s, kind, i = min(ready)
        free[s] = done[(kind, s, i)] = start + (forward[s] if kind == "F" else backward[s])
        nxt[s] += 1
    return max(free)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.sampled_from(["gpipe", "1f1b"]), st.data())
def test_the_kept_order_plays_every_split_as_events_do(k, m, schedule, data):
    times = st.floats(0.0, 1.0, allow_nan=False)
    forward = data.draw(st.lists(times, min_size=k, max_size=k))
    backward = data.draw(st.lists(times, min_size=k, max_size=k))
    assert step_time(forward, backward, schedule, m) == pytest.approx(_played_by_events(forward, backward, schedule, m),
                                                                      rel=1e-12, abs=1e-12)
