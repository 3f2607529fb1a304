"""perf/buckets.py: DDP's bucket assignment (against DDP's own rebuilt buckets) and the overlap arithmetic
on hand-made buckets."""

from __future__ import annotations

import pytest

from scaletrain.perf.buckets import (FIRST_BUCKET_BYTES, MIB, assign_buckets, backward_overlap, best_bucket_cap,
                                     bucket_limits, overlap, reductions)


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


def _ddp_rebuilt(rank, world, model_name, cap):
    """DDP's own buckets after it rebuilt them (in the order backward produced the gradients)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from multirank import group
    from scaletrain.models import build_model

    with group():
        torch.manual_seed(0)
        model = build_model(model_name, num_classes=10, in_channels=1, image_size=32)
        ddp = DDP(model, bucket_cap_mb=cap)
        for _ in range(3):  # buckets are rebuilt after the first step, logged a step later
            ddp(torch.randn(4, 1, 32, 32)).sum().backward()
        data = ddp._get_ddp_logging_data()
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    return [int(s) for s in data["rebuilt_bucket_sizes"].split(", ")], sizes


@pytest.mark.parametrize("model_name", ["resnet20", "lenet5", "mlp"])
@pytest.mark.parametrize("cap", [None, 0.25, 0.05])
def test_reverse_parameter_order_gives_ddps_rebuilt_buckets(ranks, model_name, cap):
    (rebuilt, sizes), _ = ranks.run(_ddp_rebuilt, 2, model_name, cap)
    backward_order = sizes[::-1]  # the last layer's gradients come first
    predicted = [sum(backward_order[i] for i in b) for b in assign_buckets(backward_order, cap)]
    assert predicted == rebuilt
