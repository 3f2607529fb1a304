"""The loop calibration (predict/points.py Predictor.loop): what a real step adds to isolated ops, per group
of ops, corrected for the machine's drift; and the exposed communication that grows with the step."""

from __future__ import annotations

import statistics

import pytest

from predict_fixtures import NETWORK, calibrated_here, fake_calibration
from scaletrain.models.registry import build_model
from scaletrain.predict import model as M
from scaletrain.predict import refnet
from scaletrain.predict.kinds import GROUP
from scaletrain.predict.ops import trace_ops
from scaletrain.predict.points import Predictor
from scaletrain.predict.predictor import _affine


def test_a_loop_run_on_a_slower_machine_than_the_grid_is_corrected():
    cal = calibrated_here(fake_calibration())
    steady = Predictor(cal, NETWORK).loop(1)
    cal["probe"]["loop_mean_s"] = {"1": 0.2, "2": 0.1}  # twice as slow while the loop runs ran
    drifted = Predictor(cal, NETWORK).loop(1)
    assert drifted.forward == pytest.approx(steady.forward / 2)
    assert drifted.backward == pytest.approx(steady.backward / 2)


def test_affine_through_points():
    assert _affine([(0.1, 0.003), (0.02, 0.0014)]) == pytest.approx((0.001, 0.02))
    assert _affine([(0.1, 0.004)]) == (0.004, 0.0)
    assert _affine([(0.1, 0.001), (0.02, 0.003)])[1] == 0.0  # never a negative slope
    # repeats at two x: the least-squares line through their means, whatever their order
    pts = [(0.02, 0.001), (0.1, 0.006), (0.02, 0.003), (0.1, 0.004)]
    assert _affine(pts) == pytest.approx((0.00125, 0.0375))


def _two_batches_on_two_ranks():
    """A calibration with refnet on 2 ranks at batch 32 and at batch 8 (a quarter of the compute), and those runs."""
    cal = fake_calibration()
    base = cal["loop"]["runs"][0]
    runs = []
    for batch, scale in ((32, 1.0), (8, 0.25)):
        ph = {k: v * (scale if k in ("forward", "backward") else 1.0) for k, v in base["phases_mean_s"].items()}
        runs.append({**base, "nproc": 2, "threads": 1, "batch_size": batch, "phases_mean_s": ph})
    cal["loop"]["runs"] = [base, *runs]
    return cal, runs


def test_every_repeat_of_a_two_rank_run_weighs_in_the_communication_line():
    """Four runs a batch, one of them slow (a run's exposed communication moves 25% from the next's here): the
    line goes through the runs' means, where the medians that stood for them put it flat."""
    cal, runs = _two_batches_on_two_ranks()
    p = Predictor(cal, NETWORK)
    for r in runs:  # the repeats: the buckets' time + 2 ms, at batch 32 one of four 4 ms more
        plain = p._plain_comm(r)
        r["phases_runs_s"] = [{**r["phases_mean_s"], "comm_exposed": plain + 0.002 + extra}
                              for extra in (0.0, 0.0, 0.004 if r["batch_size"] == 32 else 0.0, 0.0)]
        r["phases_mean_s"]["comm_exposed"] = plain + 0.002  # the median
    loop = Predictor(cal, NETWORK).loop(2)
    c32, c8 = (r["phases_mean_s"]["forward"] + r["phases_mean_s"]["backward"] for r in runs)
    slope = 0.001 / (c32 - c8)  # through (c8, 2 ms) and (c32, 3 ms)
    assert loop.comm_per_compute == pytest.approx(slope) and loop.comm_s == pytest.approx(0.002 - slope * c8)


def test_two_batches_on_two_ranks_separate_constant_and_proportional_communication():
    cal, runs = _two_batches_on_two_ranks()
    p = Predictor(cal, NETWORK)
    for r in runs:  # measured = what the buckets explain + 2 ms + 5% of forward and backward
        compute = r["phases_mean_s"]["forward"] + r["phases_mean_s"]["backward"]
        r["phases_mean_s"]["comm_exposed"] = p._plain_comm(r) + 0.002 + 0.05 * compute
    loop = Predictor(cal, NETWORK).loop(2)
    assert loop.comm_s == pytest.approx(0.002) and loop.comm_per_compute == pytest.approx(0.05)


def test_the_unexplained_communication_is_added_to_the_buckets():
    ops = [M.OpCost(0.01, 0.02, [4000]), M.OpCost(0.01, 0.02, [4000])]
    s = M.Setting(batch_size=8, nproc=2, cores=2, threads=1)
    plain = M.predict_step(ops, s, M.Loop(), NETWORK, lambda t, n: 0.0)["phases_s"]
    more = M.predict_step(ops, s, M.Loop(comm_s=0.001, comm_per_compute=0.1), NETWORK, lambda t, n: 0.0)["phases_s"]
    assert more["comm_exposed"] - plain["comm_exposed"] == pytest.approx(0.001 + 0.1 * (0.02 + 0.04))


def test_three_reference_networks_separate_compute_and_memory_factors():
    cal = fake_calibration()
    base = cal["loop"]["runs"][0]
    cal["loop"]["runs"] = [{**base, "model": m, "phases_mean_s": dict(base["phases_mean_s"])}
                           for m in ("refnet", "plain", "memory")]
    p = Predictor(cal, NETWORK)
    want = {"forward": (1.1, 1.5), "backward": (1.2, 1.8)}
    for r in cal["loop"]["runs"]:  # measured = a x compute-bound ops + b x memory-bound ops (and the loss)
        ref = p._reference(r)
        for d, (a, b) in want.items():
            r["phases_mean_s"][d] = a * ref[d]["compute"] + b * ref[d]["memory"]
    loop = Predictor(cal, NETWORK).loop(1)
    assert (loop.forward, loop.forward_memory) == pytest.approx(want["forward"])
    assert (loop.backward, loop.backward_memory) == pytest.approx(want["backward"])


def test_one_reference_network_gives_one_factor_for_both_groups():
    loop = Predictor(fake_calibration(), NETWORK).loop(1)
    assert loop.forward == pytest.approx(loop.forward_memory)
    assert loop.backward == pytest.approx(loop.backward_memory)


def test_each_op_takes_its_groups_factor():
    ops = [M.OpCost(0.01, 0.02, [], group="compute"), M.OpCost(0.001, 0.002, [], group="memory")]
    loop = M.Loop(forward=2.0, backward=3.0, forward_memory=5.0, backward_memory=7.0)
    ph = M.predict_step(ops, M.Setting(batch_size=8), loop, NETWORK, lambda t, n: 0.0, (0.0001, 0.0002))["phases_s"]
    assert ph["forward"] == pytest.approx(2 * 0.01 + 5 * 0.001 + 5 * 0.0001)
    assert ph["backward"] == pytest.approx(3 * 0.02 + 7 * 0.002 + 7 * 0.0002)


def test_the_reference_networks_lean_the_way_their_names_say():
    work = {}
    for name in refnet.NETS:
        ops = trace_ops(refnet.factory(name)(10, 3, 32), (3, 32, 32), 8).ops
        flops = {g: sum(o.flops for o in ops if GROUP.get(o.kind) == g) for g in ("compute", "memory")}
        work[name] = {"kinds": {o.kind for o in ops}, "ops": len(ops), **flops}
    assert "norm" not in work["plain"]["kinds"] and "norm" in work["refnet"]["kinds"]
    assert work["memory"]["ops"] > work["refnet"]["ops"] > work["plain"]["ops"]
    assert work["plain"]["compute"] > work["memory"]["compute"]


def test_the_loader_law_separates_a_batchs_own_cost_from_its_samples():
    from scaletrain.predict.calibrate import fit_loader

    rows = [{"dataset": "digits", "image_size": s, "source_pixels": s * s, "batch_size": b,
             "seconds_per_sample": 1e-5 + 2e-9 * s * s + 1e-3 / b} for s in (16, 32, 64) for b in (32, 128)]
    a, b, c, d = fit_loader(rows)["digits"]
    assert d == pytest.approx(1e-3, rel=1e-3) and a == pytest.approx(1e-5, abs=2e-6)
    assert b + c == pytest.approx(2e-9, rel=1e-3)  # source and output pixels are the same here
    cal = fake_calibration()
    cal["loader"]["fit"]["digits"] = [1e-5, 0.0, 0.0, 1e-3]
    p = Predictor(cal, NETWORK)
    assert p.loader_sample_s("digits", 8, None, 128) == pytest.approx(1e-5 + 1e-3 / 128)
    cal["loader"]["fit"]["digits"] = [1e-5, 0.0, 0.0]  # a calibration from before the batch term
    assert Predictor(cal, NETWORK).loader_sample_s("digits", 8, None, 128) == pytest.approx(1e-5)


def test_a_busy_worker_slows_compute_by_the_cpu_time_needed_over_the_cores():
    """One rank on both cores and one loader worker: the step needs its compute on two threads plus the
    worker's work, on two cores. A run with a worker in the calibration is no loop factor, and no longer an
    interference of its own (it priced the recorded worker studies worse: docs/predict.md)."""
    cal = fake_calibration()
    idle = cal["loop"]["runs"][0]
    cal["loop"]["runs"].append({**idle, "workers": 1, "batch_size": 32, "source_pixels": 4096,
                                "phases_mean_s": {**idle["phases_mean_s"], "forward": 1.0}})
    assert Predictor(cal, NETWORK).loop(1) == Predictor(fake_calibration(), NETWORK).loop(1)
    s = M.Setting(batch_size=32, cores=2, workers=1)
    assert M.compute_stretch(s, 0.01, 0.1) == pytest.approx((0.1 * 2 + 0.01) / (2 * 0.1))
    roomy = M.Setting(batch_size=32, cores=8, threads=2, workers=1)
    assert M.compute_stretch(roomy, 0.01, 0.1) == 1.0  # cores to spare: the worker slows nobody
    assert M.compute_stretch(M.Setting(batch_size=32, cores=2, workers=1, stretch=False), 0.01, 0.1) == 1.0


def test_the_slowdown_of_a_full_machine_is_the_same_network_alone_at_the_same_threads():
    """Two ranks at one thread each against one rank at one thread, same network and batch: the ratio of
    their phases is the slowdown, applied to the one-rank factors (no op model in between). Without that
    run (an older calibration) the factors come from the op sums as before."""
    cal = fake_calibration()
    base = cal["loop"]["runs"][0]
    alone = {**base, "nproc": 1, "threads": 1, "batch_size": 32,
             "phases_mean_s": {**base["phases_mean_s"], "forward": 0.030, "backward": 0.050}}
    full = {**base, "nproc": 2, "threads": 1, "batch_size": 32,
            "phases_mean_s": {**base["phases_mean_s"], "forward": 0.036, "backward": 0.055}}
    cal["loop"]["runs"] = [{**base, "batch_size": 32}, full]
    older = Predictor(cal, NETWORK).loop(2)
    cal["loop"]["runs"] = [{**base, "batch_size": 32}, alone, full]
    p = Predictor(cal, NETWORK)
    one, two = p.loop(1), p.loop(2)
    assert two.forward == pytest.approx(one.forward * 1.2) and two.backward == pytest.approx(one.backward * 1.1)
    assert two.forward_memory == pytest.approx(one.forward_memory * 1.2)
    assert (older.forward, older.backward) != pytest.approx((two.forward, two.backward))


def test_the_slowdown_pairs_the_rounds_the_calibration_ran_alternately():
    """Rounds run alternately (alone r0, full r0, alone r1, ...): each round's ratio cancels the machine's
    drift between rounds, and the slowdown is the geometric mean of the rounds' ratios (x4/3 and x1.05 here:
    x1.183), not the ratio of the two medians (x1.171)."""
    cal = fake_calibration()
    base = cal["loop"]["runs"][0]

    def run(nproc, forwards):
        rounds = [{**base["phases_mean_s"], "forward": f, "backward": 0.05} for f in forwards]
        return {**base, "nproc": nproc, "threads": 1, "batch_size": 32, "phases_runs_s": rounds,
                "phases_mean_s": {**base["phases_mean_s"], "forward": statistics.median(forwards),
                                  "backward": 0.05}}

    alone, full = run(1, [0.030, 0.040]), run(2, [0.040, 0.042])
    cal["loop"]["runs"] = [{**base, "batch_size": 32}, alone, full]
    p = Predictor(cal, NETWORK)
    assert p.loop(2).forward == pytest.approx(p.loop(1).forward * (4 / 3 * 1.05) ** 0.5)
    assert p.loop(2).backward == pytest.approx(p.loop(1).backward)
    one_round = {**full, "phases_runs_s": full["phases_runs_s"][:1]}  # one pair: the medians, as before
    cal["loop"]["runs"] = [{**base, "batch_size": 32}, alone, one_round]
    q = Predictor(cal, NETWORK)
    assert q.loop(2).forward == pytest.approx(q.loop(1).forward * 0.041 / 0.035)


def test_an_op_timed_alone_is_priced_without_what_timing_it_alone_adds():
    """calibrate's `harness`: a tiny op alone paid 13 us forward and 71 us backward more than its share of a
    chain of such ops (an autocast context per call, an autograd engine start per backward). Each op is priced
    that much less, never below the tiny op's cost in the chain nor above the time as timed; lenet5's dozen
    small ops feel it, a network of large ops hardly does. Without `harness` (older calibrations): as timed."""
    cal = fake_calibration()
    h = {"forward_s": 13e-6, "backward_s": 71e-6, "chain_forward_s": 10e-6, "chain_backward_s": 7e-6}
    cal["harness"] = {"1": h, "2": h}
    p, older = Predictor(cal, NETWORK), Predictor(fake_calibration(), NETWORK)
    assert p.in_chain(1e-3, 2e-3, 1) == pytest.approx((1e-3 - 13e-6, 2e-3 - 71e-6))
    assert p.in_chain(15e-6, 40e-6, 2) == (10e-6, 7e-6)  # a tiny op: its cost in a chain
    assert p.in_chain(5e-6, 5e-6, 1) == (5e-6, 5e-6)  # faster than the chain's tiny op: as timed
    assert older.in_chain(1e-3, 2e-3, 1) == (1e-3, 2e-3)
    assert Predictor(cal, NETWORK, without=frozenset({"harness_excess"})).in_chain(1e-3, 2e-3, 1) == (1e-3, 2e-3)
    lenet = trace_ops(build_model("lenet5", num_classes=10, in_channels=3, image_size=32), (3, 32, 32), 32)
    pairs = [(a.backward_s, b.backward_s) for a, b in zip(older.op_costs(lenet, "fp32", 1), p.op_costs(lenet, "fp32", 1))
             if a.backward_s > 0]
    assert len(pairs) >= 10  # every op that has a backward is cheaper: by the excess, or down to the chain's cost
    assert all(b == pytest.approx(a - 71e-6) or (b == 7e-6 and a < 78e-6) for a, b in pairs)


def test_calibrate_runs_the_slowdown_pair_and_the_two_batches_on_two_ranks_alternately(monkeypatch, tmp_path):
    """One round of each interleaved setting, then the next: the machine's drift over the minutes they take falls
    on the slowdown's ratio and on the communication line's two ends alike. The other settings run back to back."""
    from scaletrain.predict import calibrate

    order = []

    def fake_run(out, net, nproc, batch, quick, folder=None, threads=None):
        order.append((net, nproc, batch, threads, out.name))
        return {"model": net, "nproc": nproc, "batch_size": batch, "phases_mean_s": {"forward": 1.0},
                "step_time_mean_s": 1.0, "peak_memory_bytes": 1.0}

    monkeypatch.setattr(calibrate, "_loop_run", fake_run)
    summaries = calibrate._loop(tmp_path, False, lambda what: None)
    settings = [(net, n, b, t) for net, n, b, _r, _w, t in calibrate.LOOP_RUNS]
    interleaved = [settings[i] for i in calibrate.INTERLEAVED]
    rounds = calibrate.loop_rounds(False)
    assert [len(s["phases_runs_s"]) for s in summaries] == rounds and rounds[5] >= 4  # batch 8 on 2 ranks: 4 runs
    tail = order[-sum(rounds[i] for i in calibrate.INTERLEAVED):]
    assert [o[:4] for o in tail[:6]] == interleaved * 2
    assert [o[4] for o in tail[:3]] == ["r0"] * 3 and [o[4] for o in tail[3:6]] == ["r1"] * 3
