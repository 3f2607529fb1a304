"""The loop calibration (predict/points.py Predictor.loop): what a real step adds to isolated ops, per group
of ops, corrected for the machine's drift; and the exposed communication that grows with the step."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from predict_fixtures import NETWORK, calibrated_here, fake_calibration
from scaletrain.models.registry import build_model
from scaletrain.predict import model as M
from scaletrain.predict import refnet
from scaletrain.predict import workers as W
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


def test_a_run_with_a_worker_in_the_calibration_is_no_loop_factor():
    """Files made before 2026-11-26 hold a reference run with one loader worker: it is no loop factor."""
    cal = fake_calibration()
    idle = cal["loop"]["runs"][0]
    cal["loop"]["runs"].append({**idle, "workers": 1, "batch_size": 32, "source_pixels": 4096,
                                "phases_mean_s": {**idle["phases_mean_s"], "forward": 1.0}})
    assert Predictor(cal, NETWORK).loop(1) == Predictor(fake_calibration(), NETWORK).loop(1)


W1 = W.Workers(handoff_s=0.002, receive_s=0.001, pair_speedup=1.5)


def test_a_worker_beside_a_rank_on_every_core_costs_the_rank_its_work():
    """One rank on both cores: the worker's batch (10 ms) is made beside the rank's compute, which loses as much;
    the rank's one-thread receive (1 ms) lends the worker the other core. A rank whose compute is shorter than
    the batch loses its compute once more and waits for the rest (dwnet and LeNet-5, 2026-11-27)."""
    full = {"single_s": 0.0, "idle_s": 0.0, "cores_per_rank": 2, "threads": 2}
    long_lost, long_wait = W.worker_cost(W1, 1, 0.010, multi_s=0.045, **full)
    assert long_lost == pytest.approx(0.009) and long_wait == pytest.approx(0.001)
    short_lost, short_wait = W.worker_cost(W1, 1, 0.010, multi_s=0.003, **full)
    assert short_lost == pytest.approx(0.003) and short_wait == pytest.approx(0.001 + 0.006)
    # two workers: one is busy while the rank computes (one batch asked per batch taken); both make the rest
    assert W.worker_cost(W1, 2, 0.010, 0.045, 0.0, 0.0, 2, 2) == pytest.approx((long_lost, long_wait))
    lost2, wait2 = W.worker_cost(W1, 2, 0.010, 0.003, 0.0, 0.0, 2, 2)
    assert lost2 == pytest.approx(0.003) and wait2 == pytest.approx(0.001 + 0.006 / 1.5)


def test_a_worker_on_a_free_core_costs_nothing_and_an_accelerator_shares_none():
    # one thread of one rank on two cores: the worker has a core to itself for the whole step
    assert W.worker_cost(W1, 1, 0.010, 0.045, 0.0, 0.0, 2, 1) == pytest.approx((0.0, 0.001))
    assert W.worker_cost(W1, 1, 0.010, 0.004, 0.001, 0.0, 2, 1) == pytest.approx((0.0, 0.001 + 0.010 - 0.004 - 0.002))
    # two ranks of one thread on two cores: a rank's wait for the others leaves its core to its worker
    lost, wait = W.worker_cost(W1, 1, 0.010, 0.005, 0.0, 0.003, 1, 1)
    assert lost == pytest.approx(0.005) and wait == pytest.approx(0.001 + 0.010 - 0.003 - 0.005)
    # on an accelerator the rank's compute holds no core: its workers (4 of 8 cores) make batches the whole step
    lost, wait = W.worker_cost(W.Workers(), 4, 0.100, 0.0, 0.020, 0.0, 8, 0)
    assert lost == 0.0 and wait == pytest.approx(0.100 / 4 - 0.020)
    # the correction off: the work beside the compute costs the rank nothing
    off = W.Workers(handoff_s=0.002, receive_s=0.001, pair_speedup=1.5, sharing=False)
    assert W.worker_cost(off, 1, 0.010, 0.045, 0.0, 0.0, 2, 2) == pytest.approx((0.0, 0.001))


def test_the_workers_rows_of_a_calibration_give_their_handoff_receive_and_pair_rate():
    cal = fake_calibration()
    per_sample = Predictor(cal, NETWORK).loader_sample_s("imagefolder", 64, 64 * 64)
    cal["loader"]["workers"] = [
        {"workers": 1, "batch_size": 32, "first_batch_s": 0.05, "per_batch_s": 32 * per_sample + 0.003,
         "receive_s": 0.0015, "handoff_s": 0.0025},
        {"workers": 2, "batch_size": 32, "first_batch_s": 0.07, "per_batch_s": (32 * per_sample + 0.003) / 1.7}]
    w = Predictor(cal, NETWORK).workers()
    assert (w.handoff_s, w.receive_s, w.pair_speedup) == pytest.approx((0.0025, 0.0015, 1.7))
    # older calibrations: the hand-over against the law's in-process cost, and standing for the receive
    del cal["loader"]["workers"][0]["receive_s"], cal["loader"]["workers"][0]["handoff_s"]
    older = Predictor(cal, NETWORK).workers()
    assert older.handoff_s == pytest.approx(0.003) and older.receive_s == pytest.approx(0.003)
    assert Predictor(cal, NETWORK, without=frozenset({"worker_sharing"})).workers().sharing is False


def test_a_step_with_a_worker_puts_what_the_rank_loses_on_its_forward():
    ops = [M.OpCost(forward_s=0.020, backward_s=0.025)]
    s = M.Setting(batch_size=32, cores=2, workers=1, sample_s=0.25e-3)  # 8 ms of decode a batch
    step = M.predict_step(ops, s, M.Loop(), {"intra": {}}, lambda t, n: 0.0, workers=W1)
    assert step["phases_s"]["forward"] == pytest.approx(0.020 + 0.010 - 0.001)
    assert step["phases_s"]["backward"] == pytest.approx(0.025)
    assert step["phases_s"]["data_wait"] == pytest.approx(0.001)
    assert step["workers_lost_s"] == pytest.approx(0.009)
    none = M.predict_step(ops, M.Setting(batch_size=32, cores=2, sample_s=0.25e-3), M.Loop(), {"intra": {}},
                          lambda t, n: 0.0, workers=W1)
    assert none["phases_s"]["data_wait"] == pytest.approx(0.008) and none["workers_lost_s"] == 0.0


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
    assert not p.broadcast_apart  # one batch alone and together: refnet's buffer broadcast stays inside the ratio
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
    p = Predictor(cal, NETWORK, without=NO_BROADCAST)
    assert p.loop(2).forward == pytest.approx(p.loop(1).forward * (4 / 3 * 1.05) ** 0.5)
    assert p.loop(2).backward == pytest.approx(p.loop(1).backward)
    one_round = {**full, "phases_runs_s": full["phases_runs_s"][:1]}  # one pair: the medians, as before
    cal["loop"]["runs"] = [{**base, "batch_size": 32}, alone, one_round]
    q = Predictor(cal, NETWORK, without=NO_BROADCAST)
    assert q.loop(2).forward == pytest.approx(q.loop(1).forward * 0.041 / 0.035)


NO_BROADCAST = frozenset({"buffer_broadcast"})  # (refnet's forwards as given: DDP's broadcast has its own test)


def _pairs_at(batches: dict[int, tuple[float, float]], factor: float, constant: float):
    """A calibration with refnet alone (one thread) and on 2 ranks at each batch: forward and backward alone as
    given, on 2 ranks `factor` x alone + `constant`, in two rounds each."""
    cal = fake_calibration()
    base = cal["loop"]["runs"][0]
    runs = [{**base, "batch_size": 32}]
    for batch, (fwd, bwd) in batches.items():
        for nproc in (1, 2):
            ph = {**base["phases_mean_s"], "forward": fwd, "backward": bwd}
            if nproc == 2:
                ph = {**ph, "forward": factor * fwd + constant, "backward": factor * bwd + constant}
            runs.append({**base, "nproc": nproc, "threads": 1, "batch_size": batch, "phases_mean_s": ph,
                         "phases_runs_s": [ph, ph]})
    cal["loop"]["runs"] = runs
    return cal


def test_two_ranks_pay_a_constant_per_step_beside_the_slowdown_factor():
    """Measured (2026-11-29): LeNet-5's forward on two ranks 1.22-1.27x its time alone where ResNet-20's was 1.05-1.10x
    and refnet's 1.065x: a line of 1.08x + 0.46 ms fitted both models at both batches within 5% (DDP's wrapper,
    and compute slowed after each gloo all-reduce). With refnet alone and together at batches 32 and 2 the calibration
    separates the two: the factor from the slope, the constant per step from the small batch; priced, a 2-ms
    forward takes the constant whole and a 40-ms one hardly notices it. A ratio taken at one batch cannot."""
    cal = _pairs_at({32: (0.040, 0.060), 2: (0.003, 0.004)}, 1.07, 0.0005)
    p = Predictor(cal, NETWORK, without=NO_BROADCAST)
    one, two = p.loop(1), p.loop(2)
    assert two.forward == pytest.approx(one.forward * 1.07) and two.backward == pytest.approx(one.backward * 1.07)
    assert two.forward_s == pytest.approx(0.0005) and two.backward_s == pytest.approx(0.0005)
    assert one.forward_s == 0.0  # one rank alone: no constant
    ops = [M.OpCost(0.002, 0.002, [], "measured", "compute")]
    fwd, _ = M.compute_s(ops, M.Setting(batch_size=32, nproc=2, cores=2), two)
    assert fwd == pytest.approx(two.op_s(ops[0], "forward") + 0.0005)
    assert two.per_op[0] == pytest.approx(one.per_op[0] * 1.07)  # each op's own terms slowed with the factors
    ratio = Predictor(cal, NETWORK, without=NO_BROADCAST | {"rank_constant"}).loop(2)
    assert ratio.forward_s == 0.0 and ratio.forward == pytest.approx(one.forward * (1.07 + 0.0005 / 0.040))
    # DDP's broadcast of refnet's buffers, priced apart, is taken out of its forwards: out of the constant here
    apart = Predictor(cal, NETWORK)
    assert apart.broadcast_apart and 0 < apart._refnet_broadcast_s(2) < 0.0005
    assert apart.loop(2).forward_s == pytest.approx(0.0005 - apart._refnet_broadcast_s(2))
    assert apart.loop(2).backward_s == pytest.approx(0.0005)


def test_a_constant_that_comes_out_negative_is_noise_and_the_ratio_stands():
    """Two ranks relatively faster at the small batch than at the large one (a constant below zero): not the
    effect sought, the noise of one round. The slowdown stays the ratio at the reference batch; so too with one
    batch alone and together (every calibration before 2026-11-29)."""
    cal = _pairs_at({32: (0.040, 0.060), 2: (0.003, 0.004)}, 1.07, 0.0)
    for r in cal["loop"]["runs"]:
        if r["batch_size"] == 2 and r["nproc"] == 2:
            r["phases_mean_s"] = {**r["phases_mean_s"], "forward": 0.003 * 1.0}
            r["phases_runs_s"] = [r["phases_mean_s"]] * 2
    p = Predictor(cal, NETWORK, without=NO_BROADCAST)
    assert p.loop(2).forward_s == 0.0 and p.loop(2).forward == pytest.approx(p.loop(1).forward * 1.07)
    assert p.loop(2).backward == pytest.approx(p.loop(1).backward * 1.07)  # backward's own line held: no constant
    one_batch = _pairs_at({32: (0.040, 0.060)}, 1.07, 0.0005)
    q = Predictor(one_batch, NETWORK, without=NO_BROADCAST)
    assert q.loop(2).forward_s == 0.0 and q.loop(2).forward == pytest.approx(q.loop(1).forward * (1.07 + 0.0005 / 0.04))


def _waits(cal, line: dict[int, tuple[float, float]]):
    """`cal` with each refnet run's `data_wait` at factor x the synthetic law for its batch + constant
    ({nproc: line})."""
    p = Predictor(cal, NETWORK)
    for r in cal["loop"]["runs"]:
        b, (factor, constant) = r["batch_size"], line[r["nproc"]]
        wait = factor * b * p.loader_sample_s("synthetic", cal["loop"]["image_size"], None, b) + constant
        r["phases_mean_s"] = {**r["phases_mean_s"], "data_wait": wait}
    return cal


def test_the_ranks_own_loading_is_the_loader_law_on_the_line_refnets_runs_measured():
    """The loader's law timed alone put the held-out models' wait for their batch 13-40% low, every point (ho-s24:
    LeNet-5 0.85 ms measured at batch 32 on one rank, 0.74 priced; two ranks 1.04): inside a step the batch comes
    through the data loader's iterator, with caches the step left cold. refnet's runs alone at batch 2 and 32 and on
    2 ranks at 2, 8 and 32 measure that as a line per rank count: 1.14x + 0.14 ms and 1.16x + 0.15 ms
    (2026-11-29). A step without workers waits for the line's time; with workers the worker model stands."""
    cal = _waits(_pairs_at({32: (0.040, 0.060), 2: (0.003, 0.004)}, 1.07, 0.0005), {1: (1.1, 2e-4), 2: (1.2, 3e-4)})
    one, two = Predictor(cal, NETWORK).loop(1), Predictor(cal, NETWORK).loop(2)
    assert (one.data_factor, one.data_s) == (pytest.approx(1.1), pytest.approx(2e-4))
    assert (two.data_factor, two.data_s) == (pytest.approx(1.2), pytest.approx(3e-4))
    s = M.Setting(batch_size=64, nproc=2, cores=2, sample_s=1e-5, data_line=(two.data_factor, two.data_s))
    step = {"phases_s": {k: 0.0 for k in M.PHASES}, "step_time_s": 0.0}
    assert M.with_input(step, s)["phases_s"]["data_wait"] == pytest.approx(1.2 * 64e-5 + 3e-4)
    workers = M.with_input(step, dataclasses.replace(s, workers=1), W.Workers())["phases_s"]["data_wait"]
    assert workers == M.with_input(step, dataclasses.replace(s, workers=1, data_line=(1.0, 0.0)),
                                   W.Workers())["phases_s"]["data_wait"]
    off = Predictor(cal, NETWORK, without=frozenset({"loop_overheads"})).loop(2)
    assert (off.data_factor, off.data_s) == (1.0, 0.0)


def test_a_calibration_with_one_batch_alone_keeps_the_loader_law():
    """The line at many ranks alone (a calibration before 2026-11-29: refnet alone at batch 32 only, on two ranks at
    8 and 32) would raise the many-rank wait and not the one-rank one: every speedup would fall with it (recorded
    studies: the held-out ratios' p90 16.4% -> 20.5% on one, 44% -> 53% on the MLP's). The law stands at both."""
    cal = _waits(_pairs_at({32: (0.040, 0.060), 2: (0.003, 0.004)}, 1.07, 0.0005), {1: (1.1, 2e-4), 2: (1.2, 3e-4)})
    cal["loop"]["runs"] = [r for r in cal["loop"]["runs"] if r["nproc"] == 2 or r["batch_size"] == 32]
    for n in (1, 2):
        loop = Predictor(cal, NETWORK).loop(n)
        assert (loop.data_factor, loop.data_s) == (1.0, 0.0)


def test_the_optimizer_and_the_loops_overheads_grow_with_the_steps_compute_up_to_refnets_longest():
    """refnet alone spent 0.33 ms in its optimizer phase beyond the optimizer's law at batch 2 (7.6 ms of forward +
    backward) and 0.56 at batch 32 (90 ms); `other` 0.39 and 0.46 (2026-11-29): a long step leaves the update's
    state and the loop's out of cache. One constant from batch 32 priced LeNet-5's 4-ms steps 0.3-0.4 ms too much. A
    line through the runs at each rank count, held at the longest compute fitted over; the constants alone with
    `overhead_slope` left out or without refnet alone at two batches."""
    cal = _waits(_pairs_at({32: (0.040, 0.060), 2: (0.003, 0.004)}, 1.07, 0.0005), {1: (1.1, 2e-4), 2: (1.2, 3e-4)})
    p = Predictor(cal, NETWORK, without=NO_BROADCAST)
    for r in cal["loop"]["runs"]:
        compute = r["phases_mean_s"]["forward"] + r["phases_mean_s"]["backward"]
        law = p._reference(r)["optimizer_law_s"]
        r["phases_mean_s"] = {**r["phases_mean_s"], "optimizer": law + 3e-4 + 0.003 * compute,
                              "other": 4e-4 + 0.001 * compute}
    q = Predictor(cal, NETWORK, without=NO_BROADCAST)
    one = q.loop(1)
    assert one.optimizer_s == pytest.approx(3e-4) and one.optimizer_per_compute == pytest.approx(0.003)
    assert one.other_s == pytest.approx(4e-4) and one.other_per_compute == pytest.approx(0.001)
    assert one.overheads_upto_s == pytest.approx(0.100)  # refnet at batch 32: 40 + 60 ms
    assert one.overheads(0.004) == (pytest.approx(3e-4 + 0.003 * 0.004), pytest.approx(4e-4 + 0.001 * 0.004))
    assert one.overheads(0.300) == one.overheads(0.100)  # held at the longest step fitted over
    ops = [M.OpCost(0.002, 0.002, [4 * 1000], "measured", "compute")]
    step = M.strategy_step(ops, M.Setting(batch_size=32, nproc=1, cores=2), one, NETWORK, lambda t, n: 1e-4)
    fwd, bwd = M.compute_s(ops, M.Setting(batch_size=32, nproc=1, cores=2), one)
    assert step["phases_s"]["optimizer"] == pytest.approx(1e-4 + one.overheads(fwd + bwd)[0])
    assert step["phases_s"]["other"] == pytest.approx(one.overheads(fwd + bwd)[1])
    flat = Predictor(cal, NETWORK, without=NO_BROADCAST | {"overhead_slope"}).loop(1)
    assert flat.optimizer_per_compute == flat.other_per_compute == 0.0 and flat.overheads_upto_s is None
    cal["loop"]["runs"] = [r for r in cal["loop"]["runs"] if r["nproc"] == 2 or r["batch_size"] == 32]
    older = Predictor(cal, NETWORK, without=NO_BROADCAST).loop(2)  # refnet alone at one batch: the constants
    assert older.optimizer_per_compute == older.other_per_compute == 0.0


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
    n = len(interleaved)
    assert {(1, 32), (2, 32), (1, 2), (2, 2)} <= {(s[1], s[2]) for s in interleaved}  # two batches alone and together
    tail = order[-sum(rounds[i] for i in calibrate.INTERLEAVED):]
    assert [o[:4] for o in tail[:2 * n]] == interleaved * 2
    assert [o[4] for o in tail[:n]] == ["r0"] * n and [o[4] for o in tail[n:2 * n]] == ["r1"] * n


def test_an_image_folder_is_priced_at_the_pixels_its_transform_decodes(tmp_path):
    """A JPEG larger than the training transform needs is decoded at 1/2, 1/4 or 1/8 of its size (PIL's draft):
    `--no-augment`'s resize to 37 px lets a 128 px image decode at 64, a random crop (which may take 8% of it) not.
    Priced at its whole 128 px, LeNet-5's steps on such a folder came out 14-33% over (2026-11-27)."""
    from PIL import Image

    from scaletrain.predict.points import data_facts

    for split in ("train", "val"):
        for label in ("a", "b"):
            (tmp_path / split / label).mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (128, 128), (40 * i, 90, 200)).save(tmp_path / split / label / f"{i}.jpg")
    spec = f"imagefolder:{tmp_path}"
    assert data_facts(spec, 32, 0, 0, False)["source_pixels"] == 64 * 64
    assert data_facts(spec, 32, 0, 0, True)["source_pixels"] == 128 * 128


def test_every_point_of_a_grid_is_priced_at_the_threads_study_runs_it_at():
    """`study --nproc 1,2` on two cores runs both points at one thread (cores / the grid's largest nproc), so
    `predict` with the same flags prices them so, and `validate` matches a run only with a point at its threads
    (a one-rank run at one thread was compared with a point priced at two: 2026-11-27)."""
    from scaletrain.predict.scaling import predict_grid
    from scaletrain.study.grid import StudySpec
    from scaletrain.validate.match import differences

    cal = fake_calibration(threads=(1, 2))
    spec = StudySpec(axes={"nproc": [1, 2]}, train={"model": "lenet5", "dataset": "synthetic",
                                                    "synthetic_samples": 512}, repeats=1)
    points = predict_grid(spec, cal, NETWORK, None, "test")["points"]
    assert [p["config"]["threads"] for p in points] == [1, 1]
    given = StudySpec(axes={"nproc": [1, 2]}, train={**spec.train, "threads": 2}, repeats=1)
    assert [p["config"]["threads"] for p in predict_grid(given, cal, NETWORK, None, "test")["points"]] == [2, 2]
    run = {**points[0]["config"], "threads": 2}
    assert differences(run, points[0]["config"]) == [("threads", 2, 1)]
    assert differences({**run, "threads": None}, points[0]["config"]) == []  # a run that recorded none


def _with_op_terms(want: dict[str, tuple[float, float, float, float]]):
    """A calibration whose one-rank runs (the three networks at two threads and batch 32, refnet alone at one thread
    and batches 32 and 2) measured exactly compute x a + memory x b + ops x seconds per op + cold bytes x seconds per
    byte, per direction; an L2 of 1 MiB per core."""
    cal = fake_calibration()
    cal["device"]["l2_bytes"] = 2 ** 20
    base = cal["loop"]["runs"][0]
    cal["loop"]["runs"] = [{**base, "model": m, "threads": 2, "batch_size": 32,
                            "phases_mean_s": dict(base["phases_mean_s"])} for m in ("refnet", "plain", "memory")] + \
        [{**base, "model": "refnet", "threads": 1, "batch_size": b, "phases_mean_s": dict(base["phases_mean_s"])}
         for b in (32, 2)]
    p = Predictor(cal, NETWORK)
    for r in cal["loop"]["runs"]:
        ref = p._reference(r)
        for d, (a, b, per_op, per_byte) in want.items():
            sums = ref[d]
            r["phases_mean_s"][d] = (a * sums["compute"] + b * sums["memory"] + per_op * sums["ops"]
                                     + per_byte * sums["cold_bytes"])
    return cal


def test_each_op_pays_a_constant_and_its_cold_bytes_fitted_beside_the_factors_over_refnets_two_batches():
    """refnet alone at batch 2 and 32 tells what a step adds to each op (a constant, and its inputs, weights and output
    fetched again up to its cores' L2) from what it adds in proportion (the factors): a network of tiny ops pays the
    constant in full, one of large ops hardly notices it (2026-11-29: LeNet-5's ops of 0.1-0.3 ms ran 13-17% over
    the factors that fit refnet's)."""
    want = {"forward": (1.05, 1.2, 30e-6, 0.05e-9), "backward": (1.02, 1.4, 10e-6, 0.04e-9)}
    cal = _with_op_terms(want)
    p = Predictor(cal, NETWORK)
    assert p.op_terms
    loop = p.loop(1)
    assert (loop.forward, loop.forward_memory, loop.per_op[0], loop.per_cold_byte[0]) == \
        pytest.approx(want["forward"], rel=1e-3)
    assert (loop.backward, loop.backward_memory, loop.per_op[1], loop.per_cold_byte[1]) == \
        pytest.approx(want["backward"], rel=1e-3)
    lenet = trace_ops(build_model("lenet5", num_classes=10, in_channels=3, image_size=32), (3, 32, 32), 32)
    ops = p.op_costs(lenet, "fp32", 1)
    timed = [o for o in ops if o.forward_s > 0]
    assert all(0 < o.cold_bytes[0] <= 2 ** 20 for o in timed)  # one thread: at most one core's L2
    fwd, _ = M.compute_s(ops, M.Setting(batch_size=32, threads=1), loop)
    bare = sum(o.forward_s * loop.factor(o.group, "forward") for o in ops)
    assert fwd == pytest.approx(bare + len(timed) * 30e-6 + 0.05e-9 * sum(o.cold_bytes[0] for o in timed), rel=1e-6)
    off = Predictor(cal, NETWORK, without=frozenset({"op_overhead"}))
    assert not off.op_terms and off.loop(1).per_op == (0.0, 0.0) and off.loop(1).per_cold_byte == (0.0, 0.0)
    assert M.compute_s(off.op_costs(lenet, "fp32", 1), M.Setting(batch_size=32, threads=1), off.loop(1))[0] < fwd


def test_an_op_without_time_adds_nothing_and_an_accelerator_fetches_nothing_cold():
    loop = M.Loop(per_op=(1e-3, 2e-3), per_cold_byte=(1e-9, 1e-9))
    assert loop.op_s(M.OpCost(0.0, 0.0, [], cold_bytes=(1e6, 1e6)), "forward") == 0.0
    assert loop.op_s(M.OpCost(0.0, 0.01, [], cold_bytes=(0.0, 1e6)), "backward") == pytest.approx(0.01 + 2e-3 + 1e-3)
    cal = fake_calibration()
    cal["device"]["type"] = "cuda"
    w = trace_ops(build_model("lenet5", num_classes=10, in_channels=3, image_size=32), (3, 32, 32), 8)
    assert all(o.cold_bytes == (0.0, 0.0) for o in Predictor(cal, NETWORK).op_costs(w, "fp32", 1))


def test_an_older_calibration_with_refnet_alone_at_one_batch_keeps_its_factors_alone():
    cal = fake_calibration()  # one run: no second batch alone
    p = Predictor(cal, NETWORK)
    assert not p.op_terms and p.loop(1).per_op == (0.0, 0.0)
