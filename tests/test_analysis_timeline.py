"""The phase arithmetic of one step: tiling, the backward split, hidden vs exposed communication."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scaletrain.analysis.timeline import PHASES, length, overlap, step_cpu, step_phases, union


def test_union_merges_overlaps_and_drops_empty():
    assert union([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]


def test_length_counts_overlapping_time_once():
    assert length([(0, 2), (1, 3), (10, 11)]) == pytest.approx(4)


def test_overlap_of_two_sets():
    assert overlap([(0, 2), (4, 6)], [(1, 5)]) == pytest.approx(2)
    assert overlap([(0, 1)], [(2, 3)]) == 0


def _spans(*pairs):
    t, spans = 0.0, []
    for name, d in pairs:
        spans.append((name, t, t + d))
        t += d
    return spans


def test_backward_splits_at_the_last_ready_bucket():
    # backward span 3..8; buckets ready at 4 and 6, done at 5 and 7.5: compute ends at 6
    spans = _spans(("data_wait", 1), ("h2d", 0.5), ("forward", 1.5), ("backward", 5), ("optimizer", 1), ("other", 0.2))
    out = step_phases(spans, [(4, 5), (6, 7.5)])
    p = out["phases_s"]
    assert p["backward"] == pytest.approx(3) and p["comm_exposed"] == pytest.approx(2)
    assert out["comm_total_s"] == pytest.approx(2.5)
    assert out["comm_hidden_s"] == pytest.approx(1)  # 4..5 under backward compute; 6..7.5 exposed
    assert out["overlap_ratio"] == pytest.approx(0.4)
    assert sum(p.values()) == pytest.approx(9.2)


def test_no_communication_means_no_overlap_ratio_not_zero():
    out = step_phases(_spans(("forward", 1), ("backward", 2)), [])
    assert out["overlap_ratio"] is None
    assert out["phases_s"]["backward"] == 2 and out["phases_s"]["comm_exposed"] == 0


def test_bucket_ready_outside_backward_does_not_split_it():
    out = step_phases(_spans(("forward", 1), ("backward", 2), ("optimizer", 1)), [(3.2, 3.5)])
    assert out["phases_s"]["backward"] == 2
    assert out["comm_hidden_s"] == pytest.approx(0.3)  # overlaps the optimizer: still hidden


@given(st.lists(st.tuples(st.sampled_from([p for p in PHASES if p != "comm_exposed"]),
                          st.floats(0, 1, allow_nan=False)), min_size=1, max_size=20),
       st.lists(st.tuples(st.floats(0, 10), st.floats(0, 2)), max_size=6))
def test_phases_always_add_up_to_the_step(pairs, buckets):
    spans = _spans(*pairs)
    out = step_phases(spans, [(a, a + d) for a, d in buckets])
    total = spans[-1][2]
    assert sum(out["phases_s"].values()) == pytest.approx(total, abs=1e-9)
    assert all(v >= -1e-12 for v in out["phases_s"].values())
    assert 0 <= out["comm_hidden_s"] <= out["comm_total_s"] + 1e-12


def _cpu_spans(*triples):
    """(name, wall, cpu) durations laid end to end: (name, begin, end, cpu_begin, cpu_end)."""
    t = c = 0.0
    spans = []
    for name, d, dc in triples:
        spans.append((name, t, t + d, c, c + dc))
        t, c = t + d, c + dc
    return spans


def test_cpu_time_of_backward_splits_where_its_wall_time_does():
    # backward: wall 3..8, CPU 4..9.5; buckets ready at 4 (CPU 5) and 6 (CPU 8): compute ends at CPU 8
    spans = _cpu_spans(("data_wait", 1, 0.5), ("h2d", 0.5, 0.5), ("forward", 1.5, 3), ("backward", 5, 5.5),
                       ("optimizer", 1, 2))
    cpu = step_cpu(spans, [(4, 5.0), (6, 8.0)])
    assert cpu["backward"] == pytest.approx(4) and cpu["comm_exposed"] == pytest.approx(1.5)
    assert cpu["forward"] == pytest.approx(3) and cpu["data_wait"] == pytest.approx(0.5)
    assert sum(cpu.values()) == pytest.approx(11.5)  # the step's CPU time, every phase accounted for
    assert step_cpu(spans, [])["backward"] == pytest.approx(5.5)  # no buckets: all of it is backward
    assert step_cpu(spans, [(6, None)])["backward"] == pytest.approx(5.5)  # no CPU reading: not split
