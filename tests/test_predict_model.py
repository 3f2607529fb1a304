"""The performance model's arithmetic: regression, op tracing, phases, buckets, memory, limits."""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch import nn

from scaletrain.models.registry import build_model
from scaletrain.perf.flops import count_params, forward_flops
from scaletrain.predict import model as M
from scaletrain.predict.ops import trace_ops
from scaletrain.predict.regress import LayerTimes, fit

from predict_fixtures import NETWORK, fake_calibration, law_forward


@pytest.mark.parametrize("name", ["resnet20", "lenet5", "vgg11", "mlp", "alexnet", "resnet18"])
def test_the_ops_of_every_model_add_up_to_its_flops_and_parameters(name):
    size = 64 if name in ("alexnet",) else 32
    model = build_model(name, num_classes=10, in_channels=3, image_size=size)
    w = trace_ops(model, (3, size, size), 2)
    assert w.traced_by == "fx"
    assert sum(op.flops for op in w.ops) == 2 * forward_flops(model, (3, size, size))
    assert sum(sum(op.param_numels) for op in w.ops) == count_params(model) == w.params
    kinds = {op.kind for op in w.ops}
    assert "conv" in kinds or name == "mlp"


@pytest.mark.parametrize("name", ["resnet20", "lenet5", "vgg11", "alexnet", "resnet18"])
def test_each_convolution_is_described_and_built_with_its_own_work_and_shapes(name):
    """A convolution that pads less than "same" (LeNet's) is described by the output it makes (its law's work is its
    own multiply-adds) and built for timing as it is (its own input and padding): the grid's "same" padding at its
    input side priced LeNet-5's second convolution at twice its work."""
    from scaletrain.predict.ops import build_op
    from scaletrain.predict.regress import work

    size = 64 if name == "alexnet" else 32
    model = build_model(name, num_classes=10, in_channels=3, image_size=size)
    ops = [op for op in trace_ops(model, (3, size, size), 2).ops if op.kind == "conv"]
    real = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(ops) == len(real) > 0
    for op, conv in zip(ops, real):
        built, (x,) = build_op("conv", op.features)
        y = built(x)
        assert 4 * y.numel() == op.out_bytes  # the same output
        assert work("conv", op.features) == y.numel() * conv.in_channels * conv.kernel_size[0] ** 2
        if "pad" in op.features:
            assert built.padding == conv.padding and x.shape[1:] == (conv.in_channels, *x.shape[2:])
    if name == "lenet5":
        assert [op.features.get("pad") for op in ops] == [0, 0] and [op.features["h"] for op in ops] == [28, 10]


def test_the_first_layer_needs_no_input_gradient():
    w = trace_ops(build_model("mlp", num_classes=10, in_channels=1, image_size=8), (1, 8, 8), 4)
    linears = [op for op in w.ops if op.kind == "linear"]
    assert [op.features["grad_in"] for op in linears] == [0, 1, 1]


def test_a_model_fx_cannot_trace_is_walked_with_hooks_and_says_so():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8 * 8 * 8, 10)

        def forward(self, x):
            if x.sum() > 0:  # data-dependent: fx cannot trace it
                x = x * 2
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    w = trace_ops(Branchy(), (3, 8, 8), 4)
    assert w.traced_by == "hooks" and "torch.fx cannot trace" in w.notes[0]
    assert [op.kind for op in w.ops] == ["conv", "linear"]


def test_the_hooks_walk_counts_what_autograd_saves_as_the_fx_walk_does():
    """On the meta device a model fx cannot trace gets the same memory model as one it can: the bytes
    autograd saves, not the sum of the leaf modules' outputs (which misses the functional ops and counts
    outputs autograd never keeps)."""
    class Net(nn.Module):
        def __init__(self, branchy: bool):
            super().__init__()
            self.branchy = branchy
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.fc = nn.Linear(8 * 16 * 16, 10)

        def forward(self, x):
            if self.branchy and x.shape[0] > 1:  # concrete on meta tensors, a symbol to fx: untraceable
                x = x + 0
            return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))

    with torch.device("meta"):
        traced, hooked = (trace_ops(Net(b), (3, 16, 16), 8) for b in (False, True))
    assert (traced.traced_by, hooked.traced_by) == ("fx", "hooks")
    assert hooked.saved_bytes == traced.saved_bytes > 0
    assert hooked.activation_bytes != sum(op.out_bytes for op in hooked.ops if op.saves_activation)


def test_the_regression_recovers_a_synthetic_cost_law():
    rng = random.Random(0)
    from scaletrain.predict import grid

    rows = [{"features": f, "forward_s": law_forward("conv", f) * math.exp(rng.gauss(0, 0.03))}
            for f in grid.shapes("conv", 110)]
    train, test = rows[:90], rows[90:]
    law = fit("conv", train, "forward_s")
    assert law.cv_error is not None and law.cv_error < 0.15
    errors = [abs(law.seconds("conv", r["features"]) / law_forward("conv", r["features"]) - 1) for r in test]
    assert sorted(errors)[len(errors) // 2] < 0.10


def test_a_measured_shape_is_looked_up_and_any_other_predicted():
    cal = fake_calibration(threads=(1,))
    # the linear rows alone: the looked-up and the predicted shape are linear (every kind's fit took ~9 s)
    times = LayerTimes([r for r in cal["layers"] if r["threads"] == 1 and r["kind"] == "linear"])
    row = next(r for r in cal["layers"] if r["kind"] == "linear")
    assert times.times("linear", row["features"]) == (row["forward_s"], row["backward_s"], "measured")
    other = {**row["features"], "fout": row["features"]["fout"] + 1}
    fwd, bwd, source = times.times("linear", other)
    assert source == "regression" and fwd == pytest.approx(law_forward("linear", other), rel=0.25)


def _costs(backward_s: list[float], grad_bytes: list[int]) -> list[M.OpCost]:
    return [M.OpCost(0.001, b, [g]) for b, g in zip(backward_s, grad_bytes)]


def test_buckets_overlap_backward_as_computed_by_hand():
    # backward runs ops in reverse: op 2 (10 ms), op 1 (10 ms), op 0 (10 ms); each 1 MiB of gradient, cap 1 MiB:
    # three buckets ready at 10, 20, 30 ms, each reduced in 2 x alpha + bytes x beta x 2(P-1)/P = 5 + 10 = 15 ms
    ops = _costs([0.010, 0.010, 0.010], [1 << 20] * 3)
    beta = 0.010 / (1 << 20)
    network = {"intra": {"allreduce": {"alpha_s": 0.0025, "beta_s_per_byte": beta}}, "inter": None}
    # on an accelerator (NCCL, one stream) one at a time: reductions [10, 25], [25, 40], [40, 55] ms; backward
    # ends at 30: exposed 25 ms, hidden 5 + 15 + 0 = 20 of 45
    s = M.Setting(batch_size=8, nproc=2, cores=2, threads=1, bucket_cap_mb=1.0, cpu_compute=False)
    out = M.predict_step(ops, s, M.Loop(), network, lambda t, n: 0.0)
    assert out["phases_s"]["comm_exposed"] == pytest.approx(0.025)
    assert out["comm"]["comm_hidden_s"] == pytest.approx(0.020)
    assert out["comm"]["overlap_ratio"] == pytest.approx(20 / 45)
    assert out["comm"]["buckets"] == 3
    assert out["step_time_s"] == pytest.approx(sum(out["phases_s"].values()))
    # on a CPU gloo's two threads take a bucket beside the one before it, its latency (5 ms) alongside, its bytes
    # after: [10, 25], [20, 35], [30, 45] ms; exposed 15 ms, hidden 15 + 10 + 0 = 25 of 45
    out = M.predict_step(ops, M.Setting(batch_size=8, nproc=2, cores=2, threads=1, bucket_cap_mb=1.0), M.Loop(),
                         network, lambda t, n: 0.0)
    assert out["phases_s"]["comm_exposed"] == pytest.approx(0.015)
    assert out["comm"]["comm_hidden_s"] == pytest.approx(0.025)
    # the ring reduces on one thread of its own: one at a time on a CPU too
    ring = M.predict_step(ops, M.Setting(batch_size=8, nproc=2, cores=2, threads=1, bucket_cap_mb=1.0, strategy="ring"),
                          M.Loop(), {"intra": {"ring": network["intra"]["allreduce"]}, "inter": None},
                          lambda t, n: 0.0)
    assert ring["phases_s"]["comm_exposed"] == pytest.approx(0.025)


def test_one_rank_communicates_nothing_and_the_phases_tile_the_step():
    ops = _costs([0.01, 0.02], [4096, 4096])
    s = M.Setting(batch_size=8, nproc=1, cores=2, sample_s=1e-4)
    out = M.predict_step(ops, s, M.Loop(h2d_s=1e-5, other_s=2e-4), {"intra": {}, "inter": None},
                         lambda t, n: 1e-3)
    p = out["phases_s"]
    assert set(p) == set(M.PHASES) and p["comm_exposed"] == 0
    assert p["forward"] == pytest.approx(0.002) and p["backward"] == pytest.approx(0.03)
    assert p["data_wait"] == pytest.approx(8e-4) and p["optimizer"] == pytest.approx(1e-3)


def test_a_parameter_server_pays_the_push_and_pull_after_backward():
    ops = _costs([0.01], [4 << 20])
    net = {"intra": {"ps": {"alpha_s": 1e-3, "beta_s_per_byte": 1e-9}}, "inter": None}
    s = M.Setting(batch_size=8, nproc=3, cores=4, threads=1, strategy="ps-sync", servers=1)
    out = M.predict_step(ops, s, M.Loop(), net, lambda t, n: 0.002)
    # 2 workers push 4 MiB and pull 4 MiB through the server's link, then its update (2 ms)
    assert out["phases_s"]["comm_exposed"] == pytest.approx(2e-3 + 2 * 2 * (4 << 20) * 1e-9 + 2e-3)
    assert out["phases_s"]["optimizer"] == 0


def test_workers_hide_the_loader_behind_the_step():
    ops = _costs([0.05], [4096])
    base = dict(batch_size=32, nproc=1, cores=8, threads=1, sample_s=1e-3)
    slow = M.predict_step(ops, M.Setting(**base, workers=0), M.Loop(), {"intra": {}}, lambda t, n: 0.0)
    fast = M.predict_step(ops, M.Setting(**base, workers=2), M.Loop(), {"intra": {}}, lambda t, n: 0.0)
    assert slow["phases_s"]["data_wait"] == pytest.approx(0.032)
    assert fast["phases_s"]["data_wait"] == pytest.approx(0.0)  # 16 ms a batch per worker pair < 51 ms of step


def test_ranks_sharing_cores_stretch_compute():
    s = M.Setting(batch_size=8, nproc=4, cores=2, threads=1)
    assert M.compute_stretch(s) == pytest.approx(2.0)
    assert M.slowest_stretch(s) == pytest.approx(2.0) and M.rank_stretches(s) is None  # 4 on 2 cores: evenly
    testbed = M.Setting(batch_size=8, nproc=1, nnodes=3, cores=1, shared_cores=2)
    # 3 hosts of one thread on 2 cores: two share a core, the third has one alone (not 1.5x each)
    assert M.rank_stretches(testbed) == [2, 2, 1]
    assert M.compute_stretch(testbed) == pytest.approx(5 / 3) and M.slowest_stretch(testbed) == 2
    assert M.cores_per_rank(testbed) == pytest.approx(2 / 3) and M.cores_per_rank(s) == pytest.approx(0.5)
    two_threads = M.Setting(batch_size=8, nproc=3, cores=2, threads=2)  # thread teams: the threads over the cores
    assert M.rank_stretches(two_threads) is None and M.compute_stretch(two_threads) == pytest.approx(3.0)
    # a parameter server waits while its workers compute: 2 workers on the 2 cores, no stretch (measured on the
    # testbed's 3 hosts at 200 Mbit, 2026-11-27: LeNet-5's forward 4.3-4.6 ms under ps-sync, 4.4-8.9 under allreduce)
    ps = M.Setting(batch_size=8, nproc=1, nnodes=3, cores=1, shared_cores=2, servers=1, strategy="ps-sync")
    assert M.compute_stretch(ps) == 1.0 and M.cores_per_rank(ps) == pytest.approx(1.0)


def test_a_step_whose_ranks_meet_at_its_end_waits_for_the_one_that_shares_its_core():
    """Measured (2026-11-29, LeNet-5 on three testbed hosts sharing 2 cores, all-reduce): each step's exposed
    all-reduce 5.5 ms above the last rank's own, forward + backward 1.70x alone on average: the slowest rank's compute
    beyond the mean is waited for. A parameter server's two workers have the two cores to themselves: no stretch."""
    ops = _costs([0.01], [4096])
    net = {"intra": {k: {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9} for k in ("allreduce", "ps")}, "inter": None}
    hosts = dict(batch_size=8, nproc=1, nnodes=3, cores=1, shared_cores=2, threads=1)
    steps = {name: M.predict_step(ops, M.Setting(**hosts, strategy=name, servers=int(name.startswith("ps"))),
                                  M.Loop(), net, lambda t, n: 0.002)
             for name in ("allreduce", "ps-async")}
    even = M.predict_step(ops, M.Setting(**hosts, strategy="allreduce", stretch=False), M.Loop(), net,
                          lambda t, n: 0.002)
    ph = steps["allreduce"]["phases_s"]
    assert ph["forward"] == pytest.approx(0.001 * 5 / 3) and ph["backward"] == pytest.approx(0.01 * 5 / 3)
    compute = ph["forward"] + ph["backward"] + ph["optimizer"]
    assert ph["comm_exposed"] - even["phases_s"]["comm_exposed"] == pytest.approx(compute * (2 / (5 / 3) - 1))
    assert steps["ps-async"]["phases_s"]["forward"] == pytest.approx(0.001)  # 2 workers on the 2 cores: even


@pytest.mark.parametrize("phases, eff, want", [
    ({"data_wait": 0.5, "comm_exposed": 0.1}, 1.0, "input"),
    ({"data_wait": 0.0, "comm_exposed": 0.3}, 1.0, "communication"),
    ({"data_wait": 0.0, "comm_exposed": 0.0}, 0.5, "small-batch"),
    ({"data_wait": 0.0, "comm_exposed": 0.0}, 0.95, "compute")])
def test_limits(phases, eff, want):
    full = {p: 0.0 for p in M.PHASES} | {"forward": 0.3, "backward": 0.3} | phases
    assert M.limit(full, eff)[0] == want


def test_calibrate_cross_validates_each_law_once_and_predict_reads_it(monkeypatch):
    """fit_records (what calibrate stores as `fits`) holds each law's cross-validated error; LayerTimes given
    them fits the same seeded law without cross-validating again, and prices every shape the same."""
    from scaletrain.predict import regress

    rows = [r for r in fake_calibration(threads=(1,))["layers"] if r["kind"] == "linear"]
    records = regress.fit_records(rows)
    assert set(records) == {"fp32/1/linear/forward", "fp32/1/linear/backward"}
    fresh = LayerTimes(rows)
    assert fresh.errors()["linear/forward"]["cv_median_abs_error"] == records["fp32/1/linear/forward"][
        "cv_median_abs_error"]

    def no_cv(*_a, **_k):
        raise AssertionError("cross-validated again")

    monkeypatch.setattr(regress, "_cross_validate", no_cv)
    stored = LayerTimes(rows, records)
    assert stored.errors() == fresh.errors()
    other = {**rows[0]["features"], "fout": rows[0]["features"]["fout"] + 3}
    assert stored.times("linear", other) == fresh.times("linear", other)
    with pytest.raises(AssertionError, match="cross-validated again"):  # a record for other rows is not used
        LayerTimes(rows[:-1], records)


def test_backward_sums_the_gradients_of_a_tensor_read_twice():
    """A residual block's input is read by its body and its shortcut: autograd adds the two gradients, one
    element-wise add the size of the tensor, in backward only. A chain (lenet5) has none."""
    from scaletrain.predict.ops import trace_ops
    from scaletrain.predict.predictor import Predictor

    chain = trace_ops(build_model("lenet5", num_classes=10, in_channels=3, image_size=32), (3, 32, 32), 8)
    res = trace_ops(build_model("resnet20", num_classes=10, in_channels=3, image_size=32), (3, 32, 32), 8)
    assert not any(op.backward_only for op in chain.ops)
    sums = [op for op in res.ops if op.backward_only]
    assert len(sums) == 9 and all(op.kind == "eltwise" and op.features["inputs"] == 2 for op in sums)
    assert sums[0].features["elements"] == 8 * 16 * 32 * 32  # the stem's output, read by block 1 and its shortcut
    costs = Predictor(fake_calibration(), NETWORK).op_costs(res, "fp32", 1)
    accumulate = [c for op, c in zip(res.ops, costs) if op.backward_only]
    assert all(c.forward_s == 0.0 and c.backward_s > 0 for c in accumulate)


def test_average_pooling_is_its_own_kind_and_an_older_calibration_prices_it_as_max_pooling():
    """Average pooling's backward ran 6x max pooling's here (3x3, stride 1, 32 channels at 32 px, one thread:
    16.3 ms against 2.6 ms), so a law fitted on max pooling priced the memory-bound reference network's
    backward a third of what it measured and pushed the memory-bound loop factor to its bound. A calibration
    made before avgpool was timed prices it with the max-pooling law, as it always did."""
    from scaletrain.predict import refnet
    from scaletrain.predict.predictor import Predictor

    w = trace_ops(refnet.build_memory(10, 3, 32), (3, 32, 32), 8)
    kinds = [op.kind for op in w.ops]
    assert kinds.count("avgpool") == 6 and kinds.count("pool") == 1  # 5 blocks' AvgPool2d + the head's adaptive
    new = Predictor(fake_calibration(), NETWORK).op_costs(w, "fp32", 1)
    old_cal = fake_calibration()
    old_cal["layers"] = [r for r in old_cal["layers"] if r["kind"] != "avgpool"]
    old = Predictor(old_cal, NETWORK).op_costs(w, "fp32", 1)
    for op, n, o in zip(w.ops, new, old):
        if op.kind == "avgpool":
            assert o.forward_s > 0 and o.source in ("measured", "regression") and n.forward_s > 0
