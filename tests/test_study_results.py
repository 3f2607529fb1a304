"""Tests for study.json entries on hand-made summaries: epoch times over repeats, speedup, ideal, efficiency."""

from __future__ import annotations

import math

import pytest

from scaletrain.study.results import (above_ideal, add_speedups, point_entry, point_status, run_epoch_time,
                                      scaling_flags, study_entries)


def summary(*epoch_times: float, rate: float | None = 1000.0, top1: float = 0.9, **extra) -> dict:
    return {"status": "completed", "epoch_times_s": list(epoch_times), "samples_per_s": rate, "top1": top1, **extra}


def done(s: dict, k: int = 0) -> dict:
    return {"dir": f"points/x/r{k}", "status": "completed", "summary": s, "error": None}


def entry(pid: str, axes: dict, *runs: dict) -> dict:
    return point_entry(pid, axes, {"nproc": axes.get("nproc", 1)}, list(runs))


def test_epoch_time_is_the_median_of_the_epochs():
    assert run_epoch_time(summary(9.0, 2.0, 3.0)) == 3.0  # a slow first epoch (loader start-up) does not count
    assert run_epoch_time(summary(2.0, 4.0)) == 3.0
    assert run_epoch_time({"epoch_times_s": []}) is None


def test_repeats_average_their_medians_with_a_std():
    e = entry("nproc1", {"nproc": 1}, done(summary(5.0, 1.0, 1.0), 0), done(summary(3.0, 3.0, 3.0, rate=500.0), 1))
    assert e["epoch_time_s"] == pytest.approx(2.0)
    assert e["epoch_time_std_s"] == pytest.approx(math.sqrt(2.0))
    assert e["samples_per_s"] == pytest.approx(750.0)
    assert e["repeats"] == 2 and e["status"] == "completed"
    assert e["runs"] == ["points/x/r0", "points/x/r1"]


def test_one_repeat_has_no_std_rather_than_zero():
    e = entry("nproc1", {"nproc": 1}, done(summary(2.0)))
    assert e["epoch_time_std_s"] is None


def test_profile_fields_come_from_the_first_run_and_may_be_absent():
    diag = [{"kind": "input-bound", "share": 0.4, "message": "m", "lever": "try --workers 4"}]
    e = entry("p", {"nproc": 1}, done(summary(1.0, phases_mean_s={"forward": 0.1}, overlap_ratio=0.5, diagnosis=diag)),
              done(summary(1.0, diagnosis=[]), 1))
    assert e["phases_mean_s"] == {"forward": 0.1} and e["overlap_ratio"] == 0.5 and e["diagnosis"] == diag
    bare = entry("p", {"nproc": 1}, done({"status": "completed", "epoch_times_s": [1.0]}))
    assert bare["phases_mean_s"] is None and bare["diagnosis"] is None and bare["samples_per_s"] is None


def test_status_and_error_of_a_point():
    failed = {"dir": "points/x/r1", "status": "failed", "summary": None, "error": "boom"}
    pending = {"dir": "points/x/r1", "status": "pending", "summary": None, "error": None}
    assert point_status([done(summary(1.0)), failed]) == "failed"
    assert point_status([done(summary(1.0)), pending]) == "pending"
    assert point_status([done(summary(1.0))]) == "completed"
    e = entry("p", {"nproc": 1}, done(summary(1.0)), failed)
    assert e["status"] == "failed" and e["error"] == "r1: boom"
    assert "error" not in entry("p", {"nproc": 1}, done(summary(1.0)))
    alone = entry("p", {"nproc": 1}, {**failed, "dir": "points/x/r0"})
    assert alone["error"] == "boom" and alone["epoch_time_s"] is None and alone["repeats"] == 0


def test_speedup_ideal_and_efficiency_per_series():
    entries = add_speedups([
        entry("nproc1-workers0", {"nproc": 1, "workers": 0}, done(summary(8.0))),
        entry("nproc2-workers0", {"nproc": 2, "workers": 0}, done(summary(5.0))),
        entry("nproc4-workers0", {"nproc": 4, "workers": 0}, done(summary(2.5))),
        # another series: its own baseline, the smallest nproc in it (here 2)
        entry("nproc2-workers2", {"nproc": 2, "workers": 2}, done(summary(4.0))),
        entry("nproc4-workers2", {"nproc": 4, "workers": 2}, done(summary(2.0))),
    ])
    by_id = {e["id"]: e for e in entries}
    base = by_id["nproc1-workers0"]
    assert (base["speedup"], base["ideal_speedup"], base["efficiency"], base["baseline"]) == (1.0, 1.0, 1.0,
                                                                                             "nproc1-workers0")
    e = by_id["nproc2-workers0"]
    assert (e["speedup"], e["ideal_speedup"], e["efficiency"]) == pytest.approx((1.6, 2.0, 0.8))
    e = by_id["nproc4-workers0"]
    assert (e["speedup"], e["ideal_speedup"], e["efficiency"]) == pytest.approx((3.2, 4.0, 0.8))
    e = by_id["nproc4-workers2"]
    assert e["baseline"] == "nproc2-workers2"
    assert (e["speedup"], e["ideal_speedup"], e["efficiency"]) == pytest.approx((2.0, 2.0, 1.0))


def test_a_missing_baseline_gives_null_speedup_not_zero():
    failed = {"dir": "points/nproc1/r0", "status": "failed", "summary": None, "error": "boom"}
    entries = add_speedups([entry("nproc1", {"nproc": 1}, failed), entry("nproc2", {"nproc": 2}, done(summary(1.0)))])
    e = entries[1]
    assert e["speedup"] is None and e["efficiency"] is None
    assert e["ideal_speedup"] == 2.0 and e["baseline"] == "nproc1"
    assert entries[0]["speedup"] is None


def test_add_speedups_leaves_its_input_alone():
    original = [entry("nproc1", {"nproc": 1}, done(summary(1.0)))]
    add_speedups(original)
    assert original[0]["speedup"] is None


class P:
    def __init__(self, pid, axes):
        self.id, self.axes = pid, axes

    def settings(self):
        return {"nproc": self.axes["nproc"], "epochs": 1}


def test_study_entries_keep_grid_order_and_contract_keys():
    pts = [P("nproc1", {"nproc": 1}), P("nproc2", {"nproc": 2})]
    runs = {"nproc1": [done(summary(2.0))], "nproc2": [{"dir": "points/nproc2/r0", "status": "pending",
                                                         "summary": None, "error": None}]}
    entries = study_entries(pts, runs)
    assert [e["id"] for e in entries] == ["nproc1", "nproc2"]
    keys = {"id", "axes", "config", "runs", "status", "epoch_time_s", "epoch_time_std_s", "samples_per_s", "speedup",
            "ideal_speedup", "efficiency", "baseline", "phases_mean_s", "overlap_ratio", "diagnosis", "top1", "repeats"}
    for e in entries:
        assert keys <= set(e)
    assert entries[1]["status"] == "pending" and entries[1]["speedup"] is None
    assert entries[0]["config"] == {"nproc": 1, "epochs": 1}


def test_a_parameter_server_series_counts_only_the_workers():
    def ps(pid, nproc, seconds):
        return point_entry(pid, {"nproc": nproc, "strategy": "ps-sync"},
                           {"nproc": nproc, "strategy": "ps-sync", "ps_servers": 1}, [done(summary(seconds))])

    entries = add_speedups([ps("nproc2", 2, 8.0), ps("nproc3", 3, 5.0), ps("nproc5", 5, 4.0)])
    by_id = {e["id"]: e for e in entries}
    assert by_id["nproc3"]["ideal_speedup"] == 2.0  # 2 workers against 1 (the server trains nothing)
    assert by_id["nproc5"]["ideal_speedup"] == 4.0 and by_id["nproc5"]["efficiency"] == pytest.approx(0.5)


# ------------------------------------------------------------------ efficiency above 1.0

def test_a_point_records_how_it_ran_threads_cores_and_device():
    e = entry("nproc1", {"nproc": 1}, done(summary(1.0, threads_per_rank=2, cpu_cores=2, device="cpu")))
    assert (e["threads_per_rank"], e["cpu_cores"], e["device"]) == (2, 2, "cpu")
    older = point_entry("nproc1", {"nproc": 1}, {"nproc": 1, "threads": 3}, [done(summary(1.0))])
    assert (older["threads_per_rank"], older["cpu_cores"]) == (3, None)  # --threads, when the run did not say
    assert entry("nproc1", {"nproc": 1}, done(summary(1.0)))["threads_per_rank"] is None


def series_of(base_threads, threads, cores=2, **extra) -> list[dict]:
    """A 1-process baseline of 40 s and a 2-process point of 3.63 s: efficiency 5.51."""
    return add_speedups([
        {**entry("nproc1", {"nproc": 1}, done(summary(40.0))), "threads_per_rank": base_threads, "cpu_cores": cores,
         **extra},
        {**entry("nproc2", {"nproc": 2}, done(summary(40.0 / 11.02))), "threads_per_rank": threads,
         "cpu_cores": cores, **extra},
    ])


def test_efficiency_above_one_is_flagged_with_the_thread_difference():
    [flag] = scaling_flags(series_of(2, 1))
    assert flag["id"] == "nproc2" and flag["baseline"] == "nproc1"
    assert (flag["threads_per_rank"], flag["baseline_threads_per_rank"], flag["rerun_threads"]) == (1, 2, 1)
    assert flag["message"] == ("efficiency 5.51 above 1.0 at nproc=2 (speedup 11.02x, ideal 2.00x): not a real "
                               "speedup — the baseline (nproc=1) ran 2 threads/rank vs 1 here, or the machine was "
                               "busy while the baseline ran; rerun with --threads 1 for every point")


def test_a_starved_baseline_is_named():
    [flag] = scaling_flags(series_of(1, 1, cores=8))
    assert flag["causes"][0] == "the baseline used 1 of the 8 cores (starved)"
    assert flag["rerun_threads"] == 4 and flag["message"].endswith("rerun with --threads 4 for every point")


def test_unknown_threads_say_so_rather_than_guess():
    [flag] = scaling_flags(series_of(None, None, cores=None))
    assert flag["causes"][0].startswith("the threads per rank of this point or its baseline are unknown")
    assert flag["message"].endswith("rerun with --threads 1 for every point")


def test_gpu_points_blame_the_machine_not_threads():
    [flag] = scaling_flags(series_of(None, None, cores=None, device="cuda"))
    assert flag["rerun_threads"] is None and "--threads" not in flag["message"]
    assert flag["message"].endswith("rerun the series on an otherwise idle machine")


def test_efficiency_at_or_below_one_is_not_flagged():
    entries = add_speedups([entry("nproc1", {"nproc": 1}, done(summary(8.0))),
                            entry("nproc2", {"nproc": 2}, done(summary(4.0))),  # exactly ideal
                            entry("nproc4", {"nproc": 4}, done(summary(2.01)))])
    assert scaling_flags(entries) == []
    assert [above_ideal(x) for x in (None, 1.0, 1.004, 1.006, 5.51)] == [False, False, False, True, True]


def test_only_the_flagged_point_of_a_study_is_named_in_its_own_series():
    entries = add_speedups([
        entry("nproc1-workers0", {"nproc": 1, "workers": 0}, done(summary(8.0))),
        entry("nproc2-workers0", {"nproc": 2, "workers": 0}, done(summary(5.0))),
        entry("nproc1-workers2", {"nproc": 1, "workers": 2}, done(summary(8.0))),
        entry("nproc2-workers2", {"nproc": 2, "workers": 2}, done(summary(2.0))),
    ])
    [flag] = scaling_flags(entries)
    assert flag["id"] == "nproc2-workers2" and flag["baseline"] == "nproc1-workers2"
    assert "at nproc=2, workers=2 (speedup 4.00x, ideal 2.00x)" in flag["message"]
