"""The profiler in 2-rank training: phases tile steps, exports are written, and injected slow-downs are
diagnosed.

Each diagnosis case slows one thing on purpose (--inject) and checks the profiler sees it where it was put:
timings compared, so they run through the real CLI under `slow`. The default suite checks the structure with
the ranks in-process; the `train` command's real launch in it is test_watch's (its run is watched).
"""

import json
from pathlib import Path

import pytest

import multirank
from conftest import assert_ok, scaletrain, summary
from scaletrain.analysis import load_records
from scaletrain.distributed.device import machine_cores
from scaletrain.profiler.device_busy import device_busy

BASE = ("train", "--model", "lenet5", "--dataset", "digits", "--nproc", "2", "--epochs", "1",
        "--batch-size", "32", "--no-progress")


def _train(out: Path, *args: str) -> dict:
    proc = scaletrain(*BASE, "--out", str(out), *args)
    assert_ok(proc)
    return summary(out)


def _kinds(s: dict) -> list[str]:
    return [f["kind"] for f in s["diagnosis"]]


def _kinds_but_cpu(s: dict) -> list[str]:
    """The findings other than cpu-oversubscribed, which other jobs on a busy test machine can cause."""
    return [k for k in _kinds(s) if k != "cpu-oversubscribed"]


def _tiles_and_exports(out: Path, s: dict) -> None:
    records = load_records(out)
    assert sorted(records) == [0, 1]
    for rank_records in records.values():
        assert len(rank_records) == 22
        for r in rank_records:
            assert abs(sum(r["phases_s"].values()) - r["step_time_s"]) <= 0.01 * r["step_time_s"]
            assert {"comm_total_s", "overlap_ratio", "bytes_sent", "samples_per_s"} <= set(r)
    # exports: merged trace, per-rank torch.profiler traces and TensorBoard event files
    trace = json.loads((out / "trace.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 1}
    for rank in (0, 1):
        profiled = json.loads((out / "torch-profile" / f"rank{rank}.json").read_text())
        assert profiled["traceEvents"]
        assert device_busy(profiled, steps=2) is None  # a CPU run's trace has no GPU kernels: no busy fraction
        assert list((out / "tensorboard" / f"rank{rank}").glob("events.out.tfevents.*"))
    assert s["peak_memory_bytes"] > 0 and len(s["ranks"]) == 2


def test_phases_tile_every_step_on_every_rank_and_exports_are_written_in_process(tmp_path, ranks):
    out = tmp_path / "run"
    multirank.train(ranks, *BASE[1:], "--out", str(out), "--tensorboard", "on", "--torch-profile", "3:5")
    s = summary(out)
    _tiles_and_exports(out, s)
    assert s["profile"] == "on" and s["phases_mean_s"] and all(f["kind"] and f["message"] for f in s["diagnosis"])
    # bytes on the wire: DDP's all-reduce of lenet5's 61,706 fp32 gradients, 2 (P-1)/P = 1 x them with 2 ranks
    for rank_records in load_records(out).values():
        assert {r["bytes_sent"] for r in rank_records} == {61706 * 4}


@pytest.mark.slow  # a launch, and the straggler found by its timing: in-process above, without the timing
def test_phases_tile_every_step_on_every_rank_and_exports_are_written(tmp_path):
    out = tmp_path / "run"
    s = _train(out, "--tensorboard", "on", "--torch-profile", "3:5", "--inject", "slow-rank=1:0.03")
    _tiles_and_exports(out, s)
    # an artificially slowed rank is named as the straggler
    assert "straggler" in _kinds(s)
    finding = next(f for f in s["diagnosis"] if f["kind"] == "straggler")
    assert finding["rank"] == 1 and "rank 1" in finding["message"]
    assert s["stragglers"]["repeated"][0]["rank"] == 1
    assert s["stragglers"]["repeated"][0]["lag_mean_s"] == pytest.approx(0.03, rel=0.5)


@pytest.mark.slow  # several training launches: make test-slow
def test_slow_input_is_input_bound_and_more_workers_lower_the_wait(tmp_path):
    per_sample = 0.002
    s0 = _train(tmp_path / "w0", "--workers", "0", "--inject", f"data={per_sample}")
    s2 = _train(tmp_path / "w2", "--workers", "2", "--inject", f"data={per_sample}")
    injected = 32 * per_sample  # each rank loads 32 samples per step
    assert injected * 0.9 <= s0["phases_mean_s"]["data_wait"] <= injected * 1.6
    assert _kinds_but_cpu(s0)[0] == "input-bound"
    assert "with 0 loader workers per rank" in s0["diagnosis"][0]["message"]
    assert "--workers 2" in s0["diagnosis"][0]["lever"]
    assert s2["phases_mean_s"]["data_wait"] < 0.75 * s0["phases_mean_s"]["data_wait"]


@pytest.mark.slow  # several training launches: make test-slow
def test_slow_communication_is_exposed_and_a_small_delay_hides_behind_backward(tmp_path):
    slow = _train(tmp_path / "slow", "--bucket-cap-mb", "0.05", "--inject", "comm=0.05")
    fast = _train(tmp_path / "fast", "--bucket-cap-mb", "0.05", "--inject", "comm=0.001")
    assert slow["phases_mean_s"]["comm_exposed"] >= 0.04
    assert _kinds_but_cpu(slow)[0] == "communication-bound"
    assert slow["comm_total_mean_s"] >= 0.05
    assert fast["overlap_ratio"] > slow["overlap_ratio"] + 0.1


@pytest.mark.slow  # several training launches: make test-slow
def test_more_threads_than_cores_is_diagnosed_as_cpu_oversubscribed(tmp_path):
    cores = machine_cores()
    out = tmp_path / "crowded"
    s = _train(out, "--threads", str(cores))  # 2 ranks x all the cores: twice as many threads as cores
    for records in load_records(out).values():
        for r in records:
            assert r["threads"] == cores and r["cpu_time_s"] > 0
            assert sum(r["phases_cpu_s"].values()) == pytest.approx(r["cpu_time_s"], abs=1e-5)
    finding = next(f for f in s["diagnosis"] if f["kind"] == "cpu-oversubscribed")
    assert "threads" in finding["evidence"]
    assert finding["message"].startswith(f"2 ranks x {cores} thread{'s' if cores > 1 else ''} on {cores} core")
    assert f"--threads {max(1, cores // 2)}" in finding["lever"]
    assert s["cpu"]["utilisation"]["forward"] > 0


def test_profile_off_writes_step_times_only(tmp_path, ranks):
    out = tmp_path / "off"
    s = multirank.train(ranks, *BASE[1:], "--profile", "off", "--out", str(out))
    records = load_records(out)
    assert all("phases_s" not in r and r["step_time_s"] > 0 for rs in records.values() for r in rs)
    assert s["profile"] == "off" and s["phases_mean_s"] is None and s["diagnosis"] == []
    assert not (out / "trace.json").exists()


@pytest.mark.slow  # several training launches: make test-slow
def test_persistent_workers_remove_the_epoch_start_wait(tmp_path):
    args = ("--nproc", "1", "--model", "mlp", "--epochs", "2", "--workers", "1")
    fresh = _train(tmp_path / "fresh", *args)
    kept = _train(tmp_path / "kept", *args, "--persistent-workers")

    def second_epoch_first_wait(out):
        return next(r["phases_s"]["data_wait"] for r in load_records(out)[0] if r["epoch"] == 1)

    assert kept["top1"] is not None and fresh["epoch_start"]["wait_mean_s"] > 0
    assert second_epoch_first_wait(tmp_path / "kept") < 0.3 * second_epoch_first_wait(tmp_path / "fresh")
