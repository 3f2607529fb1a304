"""perf/buckets.py: DDP's bucket assignment (against DDP's own rebuilt buckets) and the overlap arithmetic
on hand-made buckets."""

from __future__ import annotations

import pytest

from scaletrain.perf.buckets import (FIRST_BUCKET_BYTES, MIB, assign_buckets, backward_order, backward_overlap,
                                     best_bucket_cap, bucket_limits, overlap, reductions)


def test_limits_first_bucket_then_the_cap():
    assert bucket_limits() == [MIB, 25 * MIB]
    assert bucket_limits(0.25) == [MIB // 4]  # a set cap applies to the first bucket too
    assert bucket_limits(0.05) == [52428]  # int(0.05 MiB), as DDP rounds it


def test_a_bucket_closes_once_it_holds_at_least_its_limit():
    k = 1000
    assert assign_buckets([600 * k, 600 * k, 100 * k]) == [[0, 1], [2]]  # 1.2 MB >= 1 MiB closes bucket 1
    assert assign_buckets([FIRST_BUCKET_BYTES, 1, 1]) == [[0], [1, 2]]  # exactly the limit closes it
    assert assign_buckets([100, 100, 100, 100], bucket_cap_mb=200 / MIB) == [[0, 1], [2, 3]]
    assert assign_buckets([]) == []


def test_reductions_wait_for_readiness_and_for_each_other():
    assert reductions([1.0, 1.5, 5.0], [2.0, 1.0, 0.5]) == [(1.0, 3.0), (3.0, 4.0), (5.0, 5.5)]


def test_overlap_splits_hidden_and_exposed():
    # backward ends at 4: bucket 1 (1-3) hidden, bucket 2 (3-5) half hidden, half exposed
    out = overlap(4.0, [(1.0, 3.0), (3.0, 5.0)])
    assert out == {"comm_total_s": 4.0, "comm_hidden_s": 3.0, "comm_exposed_s": 1.0, "overlap_ratio": 0.75}
    assert overlap(4.0, [])["overlap_ratio"] is None  # nothing to hide: no ratio, not 0


def test_one_bucket_at_the_end_of_backward_hides_nothing_smaller_buckets_hide_more():
    # 4 gradients of 1 MiB, each ready 1 s apart; a bucket's reduction takes 0.5 s per MiB
    grad_s, grad_bytes = [1.0, 2.0, 3.0, 4.0], [MIB] * 4
    comm = lambda n: 0.5 * n / MIB  # noqa: E731
    one = backward_overlap(grad_s, grad_bytes, comm, bucket_cap_mb=4.0)
    assert one["buckets"] == [[0, 1, 2, 3]] and one["comm_exposed_s"] == 2.0 and one["overlap_ratio"] == 0.0
    small = backward_overlap(grad_s, grad_bytes, comm, bucket_cap_mb=1.0)
    assert small["ready_s"] == [1.0, 2.0, 3.0, 4.0]
    assert small["comm_exposed_s"] == 0.5 and small["overlap_ratio"] == 0.75
    cap, best = best_bucket_cap(grad_s, grad_bytes, comm, [None, 4.0, 2.0, 1.0])
    assert cap == 1.0 and best["comm_exposed_s"] == 0.5


def test_hidden_reduction_takes_its_cpu_from_backward_and_the_cap_weighs_it():
    """Each bucket's CPU seconds, in the share of its reduction that overlaps backward, are taken from backward;
    where hiding costs backward as much as exposing would (CPU = the reduction's time), small buckets gain nothing
    and the cap with fewer messages wins."""
    grad_s, grad_bytes = [1.0, 2.0, 3.0, 4.0], [MIB] * 4
    comm = lambda n: 0.5 * n / MIB  # noqa: E731
    small = backward_overlap(grad_s, grad_bytes, comm, bucket_cap_mb=1.0, comm_cpu=lambda n: 0.2 * n / MIB)
    # buckets 1-3 (1-1.5, 2-2.5, 3-3.5) wholly hidden, bucket 4 (4-4.5) wholly exposed: 3 x 0.2 s taken
    assert small["compute_stolen_s"] == pytest.approx(0.6)
    assert backward_overlap(grad_s, grad_bytes, comm, 1.0)["compute_stolen_s"] == 0.0  # no CPU given: none
    half = backward_overlap([1.0], [MIB], lambda n: 2.0, comm_cpu=lambda n: 1.0)  # ready at the end: nothing hidden
    assert half["compute_stolen_s"] == 0.0
    cap, best = best_bucket_cap(grad_s, grad_bytes, comm, [None, 4.0, 1.0], comm_cpu=comm)
    assert cap == 4.0 and best["comm_exposed_s"] + best["compute_stolen_s"] == 2.0  # 1.0 MiB: 1.5 + 0.5
    assert best_bucket_cap(grad_s, grad_bytes, comm, [None, 4.0, 1.0])[0] == 1.0  # free hiding: small buckets


def test_mismatched_lists_are_refused():
    with pytest.raises(ValueError):
        backward_overlap([1.0], [1, 2], lambda n: 0.0)


def _ddp_rebuilt(rank, world, model_name, cap, precision="fp32"):
    """DDP's own buckets after it rebuilt them (in the order backward produced the gradients)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from multirank import group
    from scaletrain.models import build_model

    low = {"fp32": None, "bf16": torch.bfloat16}[precision]
    with group():
        torch.manual_seed(0)
        model = build_model(model_name, num_classes=10, in_channels=1, image_size=32)
        ddp = DDP(model, bucket_cap_mb=cap)
        for _ in range(3):  # buckets are rebuilt after the first step, logged a step later
            with torch.autocast("cpu", dtype=low, enabled=low is not None):
                out = ddp(torch.randn(4, 1, 32, 32))
            out.float().sum().backward()
        data = ddp._get_ddp_logging_data()
    return [int(s) for s in data["rebuilt_bucket_sizes"].split(", ")]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("model_name", ["resnet20", "lenet5", "mlp"])
@pytest.mark.parametrize("cap", [None, 0.25, 0.05])
def test_the_models_gradient_order_gives_ddps_rebuilt_buckets(ranks, model_name, cap, precision):
    """The ops in reverse, each op's gradients as autograd accumulates them (backward_order: a linear layer's bias
    before its weight in fp32, after it under autocast), bucketed as the Reducer does: DDP's own buckets."""
    from scaletrain.models import build_model
    from scaletrain.predict.ops import trace_ops

    rebuilt, _ = ranks.run(_ddp_rebuilt, 2, model_name, cap, precision)
    ops = trace_ops(build_model(model_name, num_classes=10, in_channels=1, image_size=32), (1, 32, 32), 4).ops
    order = [g for op in reversed(ops) for g in backward_order(op.kind, [4 * n for n in op.param_numels],
                                                                 precision != "fp32")]
    predicted = [sum(order[i] for i in b) for b in assign_buckets(order, cap)]
    assert predicted == rebuilt


def test_under_autocast_the_mlps_last_bias_is_a_bucket_of_its_own():
    """DDP's first bucket closes at 1 MiB: in fp32 the MLP's first layer hands its bias over before its 2 MiB weight
    (one bucket of everything); under autocast after it, alone in a second bucket (measured: two gloo all-reduces a
    step in bf16, one in fp32)."""
    grads = {"fc3": [4 * 2560, 4 * 10], "fc2": [4 * 131072, 4 * 256], "fc1": [4 * 524288, 4 * 512]}
    for autocast, count in ((False, 1), (True, 2)):
        order = [g for name in ("fc3", "fc2", "fc1") for g in backward_order("linear", grads[name], autocast)]
        assert len(assign_buckets(order)) == count
    assert backward_order("conv", [10, 1], False) == [10, 1]  # any other op: as registered, in any precision
    assert backward_order("norm", [3, 3], True) == [3, 3]


def test_gloo_lanes_let_a_bucket_start_beside_the_one_before_it():
    """Two lanes (gloo's worker threads): the second bucket's latency passes beside the first's reduction, its bytes
    after the first's; one lane (NCCL, the ring's thread): after it, whole. The same with one bucket either way."""
    ready, seconds = [1.0, 1.1], [2.0, 1.5]  # latency 1.0 each: bytes 1.0 and 0.5
    assert reductions(ready, seconds) == [(1.0, 3.0), (3.0, 4.5)]
    assert reductions(ready, seconds, lanes=2, alpha_s=1.0) == [(1.0, 3.0), (1.1, 3.5)]
    assert reductions(ready, seconds, lanes=1, alpha_s=1.0) == reductions(ready, seconds)
    assert reductions([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], lanes=2, alpha_s=1.0)[2] == (3.0, 5.0)  # waits for a lane
    comm = lambda n: 1.0 + n / MIB  # noqa: E731
    one = backward_overlap([1.0, 1.0], [2 * MIB, 1], comm, None, lanes=1)
    two = backward_overlap([1.0, 1.0], [2 * MIB, 1], comm, None, lanes=2)
    assert len(one["buckets"]) == len(two["buckets"]) == 2
    assert one["comm_exposed_s"] == pytest.approx(3.0 + 1.0) and two["comm_exposed_s"] == pytest.approx(3.0)
    # where the cores are busy the latency's own CPU work (here 0.75 of its 1.0 s) cannot pass beside: only 0.25 does
    busy = backward_overlap([1.0, 1.0], [2 * MIB, 1], comm, None, lambda n: 0.75 + n / MIB / 4, lanes=2)
    assert busy["comm_exposed_s"] == pytest.approx(3.0 + 0.75)
