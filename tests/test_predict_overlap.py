"""What DDP's buckets cost beyond their reductions' time: the CPU a bucket reduced beside backward takes from it where
the ranks fill the cores (`overlap_cpu`), and the residual's floor, one collective's wait between computing ranks
(`skew_floor`). Fake calibrations with exact laws: deterministic, no timing."""

from __future__ import annotations

import copy

import pytest

from predict_fixtures import NETWORK, fake_calibration, grads
from scaletrain.config import build_config
from scaletrain.predict.points import predict_config
from scaletrain.predict.predictor import Predictor

CAL = fake_calibration(threads=(1, 2))
FLAGS = {"model": "lenet5", "dataset": "digits", "batch_size": 16, "threads": 1}


def with_cpu(network, seconds_per_byte=2e-9):
    """The network with the collectives' CPU fitted beside their time (commbench's `cpu_s`)."""
    return {**network, "intra": {k: {**v, "cpu_alpha_s": 5e-5, "cpu_beta_s_per_byte": seconds_per_byte}
                                 for k, v in network["intra"].items()}}


def test_a_bucket_reduced_beside_backward_takes_its_cpu_from_it_where_the_cores_are_full():
    """ResNet-20 in 0.05 MiB buckets on 2 ranks of one thread: on 2 cores every hidden bucket's CPU lengthens
    backward (the exposed part does not: backward is over); on 3 cores half the ranks find a free core for it,
    on 4 every one does; a calibration without the CPU fit, or the correction left out, takes nothing."""
    cfg = build_config({}, {**FLAGS, "model": "resnet20", "nproc": 2, "bucket_cap_mb": 0.05})
    off = frozenset({"comm_residual"})
    plain = predict_config(Predictor(CAL, NETWORK, without=off), cfg, cores=2)
    full = predict_config(Predictor(CAL, with_cpu(NETWORK), without=off), cfg, cores=2)
    stolen = full["comm"]["compute_stolen_s"]
    assert stolen > 0 and plain["comm"]["compute_stolen_s"] == 0
    assert full["phases_s"]["backward"] - plain["phases_s"]["backward"] == pytest.approx(stolen, rel=1e-9)
    assert full["phases_s"]["comm_exposed"] == pytest.approx(plain["phases_s"]["comm_exposed"])
    # the hidden shares of the buckets' CPU (2 steps of alpha and the bytes once each, on 2 ranks): under all of it
    assert stolen < full["comm"]["buckets"] * 2 * 5e-5 + 2e-9 * 4 * sum(grads(cfg))
    half = predict_config(Predictor(CAL, with_cpu(NETWORK), without=off), cfg, cores=3)
    assert half["comm"]["compute_stolen_s"] == pytest.approx(stolen / 2, rel=1e-9)
    free = predict_config(Predictor(CAL, with_cpu(NETWORK), without=off), cfg, cores=4)
    assert free["comm"]["compute_stolen_s"] == 0
    left_out = predict_config(Predictor(CAL, with_cpu(NETWORK), without=off | {"overlap_cpu"}), cfg, cores=2)
    assert left_out["phases_s"] == pytest.approx(plain["phases_s"])


def test_where_hiding_costs_as_much_as_exposing_the_cap_hides_nothing():
    """ResNet-20 over a slow link (33 MB/s): where hiding is free, the smallest cap hides the most (0.25 MiB: 82%
    hidden); with a collective's CPU as long as its time (nothing but the host's cores moves the bytes) hiding buys
    nothing, and one bucket (fewer messages) is chosen."""
    cfg = build_config({}, {**FLAGS, "model": "resnet20", "nproc": 2})
    off = frozenset({"comm_residual"})
    slow = {**NETWORK, "intra": {k: {"alpha_s": 1e-4, "beta_s_per_byte": 3e-8} for k in NETWORK["intra"]}}
    free = predict_config(Predictor(CAL, slow, without=off), cfg, cores=2)["comm"]
    busy = {**slow, "intra": {k: {**v, "cpu_alpha_s": v["alpha_s"], "cpu_beta_s_per_byte": v["beta_s_per_byte"]}
                              for k, v in slow["intra"].items()}}
    costly = predict_config(Predictor(CAL, busy, without=off), cfg, cores=2)["comm"]
    assert free["best_bucket_cap_mb"] == 0.25 and free["best_overlap_ratio"] > 0.8
    assert costly["best_overlap_ratio"] == 0 and costly["best_bucket_cap_mb"] not in (0.25, 0.5)


def test_the_residual_is_never_under_one_collectives_wait_between_computing_ranks():
    """The exposed communication beyond the buckets: the reference runs' line in compute, or the halo fit's wait
    beyond the idle point-to-point's where that is larger (a short step); left out with the residual."""
    cfg = build_config({}, {**FLAGS, "nproc": 2})
    net = {**NETWORK, "intra": {**NETWORK["intra"], "halo": {"alpha_s": 2e-3, "beta_s_per_byte": 1e-9}}}
    skew = 2e-3 - NETWORK["intra"]["ps"]["alpha_s"]
    floored = predict_config(Predictor(CAL, net), cfg)
    line = predict_config(Predictor(CAL, net, without=frozenset({"skew_floor"})), cfg)
    assert line["comm"]["residual_s"] < skew  # LeNet-5's short step: the line alone is under the floor
    assert floored["comm"]["residual_s"] == pytest.approx(skew)
    assert floored["phases_s"]["comm_exposed"] - line["phases_s"]["comm_exposed"] == \
        pytest.approx(skew - line["comm"]["residual_s"])
    assert predict_config(Predictor(CAL, NETWORK), cfg)["comm"]["residual_s"] == line["comm"]["residual_s"]  # no halo
    assert predict_config(Predictor(CAL, net, without=frozenset({"comm_residual"})), cfg)["comm"]["residual_s"] == 0


def test_a_compressed_bucket_is_priced_by_its_hooks_measured_exchange_where_the_calibration_has_it():
    """`--compress fp16` inside a node: the bucket's whole exchange (cast, all-reduce of half the bytes, cast back)
    at the calibration's `fp16` fit on the bucket's fp32 bytes; without that fit, half the bytes at the all-reduce's
    fit plus the casts by the element-wise law; across nodes the payload crosses the link: the fit is not used."""
    from scaletrain.perf.alphabeta import predict as alpha_beta

    cfg = build_config({}, {**FLAGS, "nproc": 2, "compress": "fp16"})
    off = frozenset({"comm_residual"})
    net = {**NETWORK, "intra": {**NETWORK["intra"], "fp16": {"alpha_s": 3e-4, "beta_s_per_byte": 2e-9}}}
    fitted = predict_config(Predictor(CAL, net, without=off), cfg)["comm"]
    assert fitted["buckets"] == 1  # LeNet-5's gradients fill one bucket
    nbytes = 4 * sum(grads(cfg))
    assert fitted["comm_total_s"] == pytest.approx(alpha_beta(3e-4, 2e-9, 2, nbytes), rel=1e-9)
    p = Predictor(CAL, NETWORK, without=off)
    plain = predict_config(p, cfg)["comm"]
    want = alpha_beta(1e-4, 1e-9, 2, nbytes // 2) + p.codec_s(nbytes // 4, 1)
    assert plain["comm_total_s"] == pytest.approx(want, rel=1e-6)
    two_nodes = build_config({}, {**FLAGS, "nproc": 1, "nnodes": 2, "master_port": 29500, "compress": "fp16"})
    assert predict_config(Predictor(CAL, net, without=off), two_nodes)["comm"]["comm_total_s"] == \
        pytest.approx(predict_config(p, two_nodes)["comm"]["comm_total_s"], rel=1e-9)


def test_ddp_broadcasts_a_models_buffers_at_every_forward_and_it_is_priced_there():
    """DDP broadcasts the buffers (batch norms' running statistics) from rank 0 at the start of each forward:
    measured 1.8-2.0 ms a forward for ResNet-20 on two ranks of one thread (with and without it alternated,
    2026-11-29), priced as one collective between computing ranks at the halo fit on the buffers' bytes. Here refnet
    (1,776 bytes of buffers) ran on two ranks exactly that much longer a forward than alone, at batches 32 and 2:
    priced apart, the broadcast is ResNet-20's alone (LeNet-5 has no buffers), where left out it was the two-rank
    constant of every model. One rank broadcasts nothing; the ring runs DDP too; a calibration with one batch alone
    and together keeps it inside its ratio."""
    net = {**NETWORK, "intra": {**NETWORK["intra"], "halo": {"alpha_s": 1.5e-3, "beta_s_per_byte": 1e-9}}}
    off = frozenset({"comm_residual"})
    refnet_b = 1.5e-3 + 1e-9 * 1776
    cal = copy.deepcopy(CAL)
    base = cal["loop"]["runs"][0]
    for n in (1, 2):
        for b, fwd in ((32, 0.040), (2, 0.003)):
            ph = {**base["phases_mean_s"], "forward": fwd + (refnet_b if n == 2 else 0.0), "backward": 2 * fwd}
            cal["loop"]["runs"].append({**base, "nproc": n, "threads": 1, "batch_size": b, "phases_mean_s": ph})

    def point(model, nproc, without=off, strategy="allreduce", calibration=cal):
        cfg = build_config({}, {**FLAGS, "model": model, "nproc": nproc, "strategy": strategy})
        return predict_config(Predictor(calibration, net, without=without), cfg, cores=2)

    b = 1.5e-3 + 1e-9 * 5656  # ResNet-20's 19 batch norms: running mean and variance of 16-64 channels, a count each
    two, left = point("resnet20", 2), point("resnet20", 2, off | {"buffer_broadcast"})
    assert two["comm"]["buffer_broadcast_s"] == pytest.approx(b) and left["comm"]["buffer_broadcast_s"] == 0
    assert two["phases_s"]["forward"] - left["phases_s"]["forward"] == pytest.approx(b - refnet_b)
    lenet, lenet_left = point("lenet5", 2), point("lenet5", 2, off | {"buffer_broadcast"})
    assert lenet["comm"]["buffer_broadcast_s"] == 0
    assert lenet_left["phases_s"]["forward"] - lenet["phases_s"]["forward"] == pytest.approx(refnet_b)
    assert point("resnet20", 2, strategy="ring")["comm"]["buffer_broadcast_s"] == pytest.approx(b)
    assert "buffer_broadcast_s" not in point("resnet20", 1)["comm"]
    assert point("resnet20", 2, calibration=CAL)["comm"]["buffer_broadcast_s"] == 0  # one batch: inside the ratio
