"""Straggler statistics over hand-made per-rank records."""

import pytest

from scaletrain.analysis.stragglers import slowest_by_step, straggler_stats


def _rec(step, step_time, exposed):
    return {"step": step, "step_time_s": step_time, "phases_s": {"comm_exposed": exposed}}


def _run(lags_rank1, steps=20):
    # every rank's step takes 100 ms; rank 1 works longer, so rank 0 waits for it in communication
    return {0: [_rec(s, 0.1, 0.01 + lags_rank1) for s in range(steps)],
            1: [_rec(s, 0.1, 0.01) for s in range(steps)]}


def test_slowest_rank_is_the_one_that_waits_least():
    rows = slowest_by_step(_run(0.03))
    assert {rank for _, rank, _ in rows} == {1}
    assert all(lag == pytest.approx(0.03) for _, _, lag in rows)


def test_repeatedly_last_rank_is_named_above_threshold():
    stats = straggler_stats(_run(0.03), step_time_mean_s=0.1, threshold=0.1)
    assert stats["slowest_counts"] == {"1": 20}
    assert [s["rank"] for s in stats["repeated"]] == [1]
    assert stats["repeated"][0]["lag_mean_s"] == pytest.approx(0.03)
    assert stats["spread_mean_s"] == pytest.approx(0.03)


def test_small_lag_is_not_a_straggler():
    assert straggler_stats(_run(0.005), step_time_mean_s=0.1, threshold=0.1)["repeated"] == []


def test_alternating_slowest_is_not_a_straggler():
    records = {0: [], 1: []}
    for s in range(20):
        slow = s % 2
        records[slow].append(_rec(s, 0.1, 0.0))
        records[1 - slow].append(_rec(s, 0.1, 0.05))
    assert straggler_stats(records, 0.1, 0.1)["repeated"] == []


def test_one_rank_has_no_stragglers():
    stats = straggler_stats({0: [_rec(0, 0.1, 0.0)]}, 0.1, 0.1)
    assert stats["steps_compared"] == 0 and stats["spread_mean_s"] is None


def test_steps_missing_on_a_rank_are_not_compared():
    run = _run(0.03, steps=4)
    run[1] = run[1][:2]
    assert len(slowest_by_step(run)) == 2
