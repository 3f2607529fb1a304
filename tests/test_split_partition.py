"""The exact partitioner against brute force, its memory model, and the baselines (split/partition.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaletrain.errors import UserError
from scaletrain.split.partition import (BlockCost, Infeasible, baselines, by_params, by_time, check_memory, evaluate,
                                        exhaustive, optimal, smallest_limit, uniform)


def block(i, f=1.0, b=2.0, p=0, saved=0, out=0):
    return BlockCost(f"b{i}", f, b, p, saved, out)


costs_st = st.lists(st.tuples(st.floats(0, 1), st.floats(0, 2), st.integers(0, 1000), st.integers(0, 1000),
                              st.integers(0, 500)), min_size=1, max_size=9).map(
    lambda rows: [BlockCost(f"b{i}", *r) for i, r in enumerate(rows)])
pipeline_st = st.fixed_dictionaries({
    "microbatches": st.integers(1, 6), "schedule": st.sampled_from(["gpipe", "1f1b"]),
    "link_bytes_per_s": st.sampled_from([float("inf"), 1000.0, 1e5]), "latency_s": st.sampled_from([0.0, 0.01]),
    "state_copies": st.integers(0, 2)})


@settings(max_examples=150, deadline=None)
@given(costs_st, st.integers(1, 4), pipeline_st)
def test_optimal_matches_exhaustive(costs, k, pipe):
    k = min(k, len(costs))
    best, brute = optimal(costs, k, **pipe), exhaustive(costs, k, **pipe)
    assert best.step_s == pytest.approx(brute.step_s, rel=1e-9, abs=1e-12)  # the least step there is
    if best.step_s > brute.step_s * (1 + 1e-9):  # (splits whose steps differ by rounding alone are a tie)
        assert best.bottleneck_s <= brute.bottleneck_s


@settings(max_examples=150, deadline=None)
@given(costs_st, st.integers(1, 4), pipeline_st, st.floats(0.2, 1.5), st.booleans())
def test_memory_limit_respected_or_refused(costs, k, pipe, scale, offload):
    k = min(k, len(costs))
    pipe = {**pipe, "offload_bytes_per_s": 1e4 if offload else None}
    free = optimal(costs, k, **pipe)
    limit = max(1, int(free.peak_memory * scale))
    try:
        brute = exhaustive(costs, k, memory_limit=limit, **pipe)
    except Infeasible as e:
        with pytest.raises(Infeasible) as refused:
            optimal(costs, k, memory_limit=limit, **pipe)
        assert refused.value.smallest == e.smallest == smallest_limit(costs, k, **pipe) > limit
        with pytest.raises(Infeasible):  # the bytes alone tell
            check_memory(costs, k, memory_limit=limit, **pipe)
        assert f"{e.smallest} bytes" in str(refused.value) and "\n" not in str(refused.value)
        at_smallest = optimal(costs, k, memory_limit=e.smallest, **pipe)  # the limit named is enough
        assert at_smallest.fits and at_smallest.peak_memory <= e.smallest
        return
    check_memory(costs, k, memory_limit=limit, **pipe)
    best = optimal(costs, k, memory_limit=limit, **pipe)
    assert best.fits and all(s["memory_bytes"] <= limit for s in best.stages)
    assert best.step_s == pytest.approx(brute.step_s, rel=1e-9, abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(costs_st, st.integers(1, 4))
def test_baseline_bounds_are_valid(costs, k):
    k = min(k, len(costs))
    for bounds in (uniform(len(costs), k), by_params(costs, k), by_time(costs, k)):
        assert len(bounds) == k and bounds[0][0] == 0 and bounds[-1][1] == len(costs)
        assert all(lo < hi for lo, hi in bounds) and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


def test_uniform_gives_the_first_stages_the_extra_blocks():
    assert uniform(11, 2) == [(0, 6), (6, 11)]
    assert uniform(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert uniform(3, 3) == [(0, 1), (1, 2), (2, 3)]


def test_params_and_time_balance_their_own_weight():
    costs = [block(0, f=1, b=1, p=100), block(1, f=1, b=1, p=100), block(2, f=1, b=1, p=100),
             block(3, f=6, b=6, p=1)]
    assert by_params(costs, 2) in ([(0, 2), (2, 4)], [(0, 1), (1, 4)])  # 200 | 101 or 100 | 201: max 200
    assert max(sum(c.param_bytes for c in costs[lo:hi]) for lo, hi in by_params(costs, 2)) == 200
    assert by_time(costs, 2) == [(0, 3), (3, 4)]  # 6 s | 12 s


def test_time_baseline_ignores_transfers_that_optimal_avoids():
    # equal compute; cutting after block 1 sends a huge tensor, after block 2 a small one
    costs = [block(0, 1, 1, out=10_000), block(1, 1, 1, out=10_000), block(2, 1, 1, out=10), block(3, 1, 1)]
    pipe = dict(microbatches=4, schedule="1f1b", link_bytes_per_s=1000.0)
    assert by_time(costs, 2) == [(0, 2), (2, 4)]
    best = optimal(costs, 2, **pipe)
    assert best.bounds == [(0, 3), (3, 4)] and best.bottleneck_s == pytest.approx(6 + 2 * 0.01)
    assert best.step_s < evaluate(costs, by_time(costs, 2), **pipe).step_s


def test_stage_figures_and_step_formula():
    costs = [block(0, 1, 2, p=10, saved=100, out=7), block(1, 3, 4, p=20, saved=200, out=5)]
    p = evaluate(costs, [(0, 1), (1, 2)], microbatches=3, schedule="gpipe", link_bytes_per_s=7.0,
                 latency_s=0.5, state_copies=1)
    first, second = p.stages
    assert first["transfer_s"] == pytest.approx(2 * (0.5 + 1)) == second["transfer_s"]
    assert first["time_s"] == pytest.approx(3 + 3) and second["time_s"] == pytest.approx(7 + 3)
    assert p.bottleneck == 1 and p.step_s == pytest.approx(6 + 10 + 2 * 10)
    # gpipe keeps all 3 micro-batches in flight; the second stage also keeps its received input
    # (without a memory model's stages, from the blocks' bytes: the other micro-batches' saved tensors and input;
    # working, the one in backward's and its input's and output's gradient buffers)
    assert first["memory"] == {"weights": 10, "gradients": 10, "optimizer": 10, "activations": 2 * 100,
                               "working": 100 + 7}
    assert second["memory"] == {"weights": 20, "gradients": 20, "optimizer": 20, "activations": 2 * (200 + 7),
                                "working": 200 + 7 + 7}
    one = evaluate(costs, [(0, 1), (1, 2)], microbatches=3, schedule="1f1b")
    assert [s["in_flight"] for s in one.stages] == [2, 1]  # 1f1b: min(M, K - s)


def test_offload_chooses_optimizer_then_activations_and_prices_them():
    costs = [block(0, 1, 1, p=100, saved=1000, out=10), block(1, 1, 1, p=100, saved=1000, out=10)]
    pipe = dict(microbatches=4, schedule="gpipe", state_copies=2, offload_bytes_per_s=100.0)
    plain = evaluate(costs, [(0, 1), (1, 2)], **pipe)
    need = plain.peak_memory
    opt = evaluate(costs, [(0, 1), (1, 2)], memory_limit=need - 200, **pipe)
    assert {s["offload"] for s in opt.stages} == {"optimizer"} and opt.fits
    assert opt.stages[0]["update_s"] == pytest.approx(2.0) and opt.step_s == pytest.approx(plain.step_s + 2.0)
    acts = evaluate(costs, [(0, 1), (1, 2)], memory_limit=2000, **pipe)
    assert acts.stages[0]["offload"] == "activations" and acts.stages[0]["offload_s"] == pytest.approx(20.0)
    with pytest.raises(Infeasible, match="even with offload"):
        optimal(costs, 2, memory_limit=500, **pipe)


def test_a_memory_models_stages_are_what_the_limit_and_the_offloads_hold():
    """Given the memory model's stages, the split holds them to the limit, offloads their optimizer state and the
    in-flight activations (priced per micro-batch: activations / (in flight - 1)), and reports them as given."""
    costs = [block(0, 1, 1, p=100, saved=1, out=10), block(1, 1, 1, p=100, saved=1, out=10)]
    asked = []

    def memory(s, i, j):
        asked.append((s, i, j))
        return {"weights": 100 * (j - i), "gradients": 100 * (j - i), "optimizer": 200 * (j - i),
                "activations": 3 * 1000 * (j - i), "working": 500}

    pipe = dict(microbatches=4, schedule="gpipe", offload_bytes_per_s=100.0, memory=memory)
    plain = evaluate(costs, [(0, 1), (1, 2)], **pipe)
    assert plain.stages[0]["memory"] == memory(0, 0, 1) and plain.peak_memory == 3900 and asked
    opt = evaluate(costs, [(0, 1), (1, 2)], memory_limit=3700, **pipe)
    assert [s["offload"] for s in opt.stages] == ["optimizer"] * 2 and opt.stages[0]["memory"]["optimizer"] == 0
    acts = evaluate(costs, [(0, 1), (1, 2)], memory_limit=1000, **pipe)
    assert acts.stages[0]["offload"] == "activations" and acts.stages[0]["memory"]["activations"] == 0
    assert acts.stages[0]["offload_s"] == pytest.approx(2 * 1000 / 100.0)  # one micro-batch's 1000 out and back
    assert optimal(costs, 2, memory_limit=3900, **pipe).fits
    with pytest.raises(Infeasible) as e:
        optimal(costs, 2, memory_limit=3899, **{**pipe, "offload_bytes_per_s": None})
    assert e.value.smallest == 3900


def test_bad_stage_counts_are_one_line():
    costs = [block(i) for i in range(3)]
    with pytest.raises(UserError, match="more than the model's 3 blocks \\(2 cut points\\)"):
        optimal(costs, 4, microbatches=1, schedule="gpipe")
    with pytest.raises(UserError, match="at least 1 stage"):
        optimal(costs, 0, microbatches=1, schedule="gpipe")
    with pytest.raises(UserError, match="schedule"):
        optimal(costs, 2, microbatches=1, schedule="zb")
    with pytest.raises(UserError, match="contiguously"):
        evaluate(costs, [(0, 2), (1, 3)], microbatches=1, schedule="gpipe")


def test_baselines_are_priced_by_the_same_model():
    costs = [block(i, f=i + 1, b=2 * (i + 1), p=10 * (5 - i)) for i in range(5)]
    pipe = dict(microbatches=4, schedule="1f1b")
    base = baselines(costs, 2, **pipe)
    assert set(base) == {"uniform", "params", "time"}
    assert base["uniform"].bounds == [(0, 3), (3, 5)] and base["uniform"].method == "uniform"
    best = optimal(costs, 2, **pipe)
    assert all(best.step_s <= p.step_s + 1e-12 for p in base.values())
    assert base["time"].bottleneck_s <= best.bottleneck_s  # time balance has the least bottleneck, not the least step
