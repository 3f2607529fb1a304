"""A strategy's own host work (Strategy.host_work): timed by calibrate, priced by the strategy's cost from the
calibration's rows (a parameter server's packing, FSDP's optimizer on DTensor shards, DDP's copies into its buckets
and back)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from predict_fixtures import NETWORK, fake_calibration, grads
from scaletrain.config import build_config
from scaletrain.predict.points import predict_config
from scaletrain.predict.predictor import Predictor


def worker_law(tensors, numel):
    return 1e-4 + 2e-5 * tensors + 3e-9 * numel


def server_law(tensors, numel, extra):
    return 2e-4 + 1e-5 * tensors + 2e-9 * numel + 5e-9 * extra


def fsdp_law(tensors, numel):
    return 3e-4 + 1e-4 * tensors + 1e-9 * numel


def copy_in_law(tensors, numel):
    return 2e-5 + 3e-6 * tensors + 4e-10 * numel


def copy_out_law(tensors, numel):
    return 1e-5 + 2e-6 * tensors + 3e-10 * numel


def with_host_work(cal):
    """The calibration with exact host-work rows at both thread counts (each law fits its rows exactly)."""
    cal = copy.deepcopy(cal)
    sets = ((8, 1 << 14), (64, 1 << 14), (8, 1 << 20), (64, 1 << 18), (160, 1 << 18))
    cal["host_work"] = {
        "ps": [{"threads": t, "tensors": k, "numel": n, "extra_numel": e, "worker_s": worker_law(k, n),
                "server_s": server_law(k, n, e)} for t in cal["threads"] for k, n in sets for e in (0, 2 * n)],
        "fsdp": [{"threads": t, "optimizer": o, "tensors": k, "numel": n, "seconds": fsdp_law(k, n)}
                 for t in cal["threads"] for o in ("sgd", "adamw") for k, n in sets],
        "ddp": [{"threads": t, "tensors": k, "numel": n, "copy_in_s": copy_in_law(k, n),
                 "copy_out_s": copy_out_law(k, n)} for t in cal["threads"] for k, n in sets]}
    return cal


CAL = fake_calibration(threads=(1, 2))
FLAGS = {"model": "lenet5", "dataset": "digits", "batch_size": 16, "threads": 1}


@pytest.mark.parametrize("strategy, nproc", [("ps-sync", 3), ("ps-async", 3), ("ps-sync", 2)])
def test_a_parameter_servers_packing_is_priced_from_the_calibrations_host_work(strategy, nproc):
    """The worker packs its gradients and unpacks the parameters; the server sums the pushes (one more pass per
    worker beyond the first, ps-sync) and flattens its shard: both on the exchange's path, by the calibration's
    laws; a calibration without the rows prices neither and says so."""
    cfg = build_config({}, {**FLAGS, "strategy": strategy, "nproc": nproc})
    old = Predictor(CAL, NETWORK)
    before = predict_config(old, cfg)["phases_s"]
    after = predict_config(Predictor(with_host_work(CAL), NETWORK), cfg)["phases_s"]
    sizes = grads(cfg)
    tensors, numel, workers = len(sizes), sum(sizes), nproc - 1
    extra = (workers - 1) * numel if strategy == "ps-sync" else 0
    added = worker_law(tensors, numel) + server_law(tensors, numel, extra)
    assert after["comm_exposed"] - before["comm_exposed"] == pytest.approx(added, rel=1e-6)
    assert {k: v for k, v in after.items() if k != "comm_exposed"} == \
        pytest.approx({k: v for k, v in before.items() if k != "comm_exposed"})
    assert any("host work" in n and "calibrate again" in n for n in old.notes)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw", "nesterov"])
def test_fsdp_steps_its_shards_by_the_sharded_optimizers_law(optimizer):
    """Each of 2 ranks steps half of every tensor as DTensors: the calibration's sharded law at half the values
    (an optimizer without rows takes sgd's); without the rows, the plain law at half the values."""
    cfg = build_config({}, {**FLAGS, "strategy": "fsdp", "nproc": 2, "optimizer": optimizer})
    p = Predictor(with_host_work(CAL), NETWORK)
    point = predict_config(p, cfg)
    sizes = grads(cfg)
    loop = p.loop(2)
    want = (fsdp_law(len(sizes), sum(sizes) // 2) + loop.optimizer_s) * point["stretch"]
    assert point["phases_s"]["optimizer"] == pytest.approx(want, rel=1e-6)
    plain = Predictor(CAL, NETWORK)
    law = plain.optimizer_law(optimizer, 1)
    want = (law(len(sizes), sum(sizes) // 2) + loop.optimizer_s) * point["stretch"]
    assert predict_config(plain, cfg)["phases_s"]["optimizer"] == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("strategy", ["allreduce", "ring"])
def test_ddps_copies_into_its_buckets_and_back_are_priced_from_the_calibrations_host_work(strategy):
    """Each gradient copied into its bucket as backward produces it (backward longer) and every reduced bucket
    copied back after the last reduction (exposed), by the calibration's laws; left out by name, or where the
    calibration has no rows, neither."""
    cfg = build_config({}, {**FLAGS, "strategy": strategy, "nproc": 2})
    off = frozenset({"comm_residual"})  # (the residual is fitted beyond the bucket model, copies included)
    before = predict_config(Predictor(CAL, NETWORK, without=off), cfg)
    after = predict_config(Predictor(with_host_work(CAL), NETWORK, without=off), cfg)
    sizes = grads(cfg)
    stretch = after["stretch"]
    assert after["phases_s"]["backward"] - before["phases_s"]["backward"] == \
        pytest.approx(copy_in_law(len(sizes), sum(sizes)) * stretch, rel=1e-6)
    assert after["phases_s"]["comm_exposed"] - before["phases_s"]["comm_exposed"] == \
        pytest.approx(copy_out_law(len(sizes), sum(sizes)) * stretch, rel=1e-6)
    assert after["comm"]["host_copies_s"] > 0 and before["comm"]["host_copies_s"] == 0
    left_out = predict_config(Predictor(with_host_work(CAL), NETWORK, without=off | {"ddp_copies"}), cfg)
    assert left_out["phases_s"] == pytest.approx(before["phases_s"])


def test_the_host_work_is_timed_on_the_real_code_paths():
    """calibrate's rows: the parameter server's (worker and server, each set once per count of pushes) and FSDP's
    (every optimizer on DTensor shards, in a one-rank group it takes down again)."""
    from scaletrain.comm.ddp_host import rows as ddp_rows
    from scaletrain.comm.fsdp_host import rows as fsdp_rows
    from scaletrain.comm.ps.host_work import rows as ps_rows

    torch.set_num_threads(1)
    ps = ps_rows(torch.device("cpu"), 1, quick=True)
    assert [(r["tensors"], r["extra_numel"]) for r in ps] == [(8, 0), (64, 0), (8, 0)]
    assert all(r["worker_s"] > 0 and r["server_s"] > 0 and r["threads"] == 1 for r in ps)
    fsdp = fsdp_rows(torch.device("cpu"), 1, quick=True)
    assert {r["optimizer"] for r in fsdp} == {"sgd", "nesterov", "adagrad", "adamw"}
    assert all(r["seconds"] > 0 for r in fsdp) and len(fsdp) == 12
    ddp = ddp_rows(torch.device("cpu"), 1, quick=True)
    assert [(r["tensors"], r["numel"]) for r in ddp] == [(8, 1 << 14), (64, 1 << 14), (8, 1 << 20)]
    assert all(r["copy_in_s"] > 0 and r["copy_out_s"] > 0 for r in ddp)
    assert not dist.is_initialized()
