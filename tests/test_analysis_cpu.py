"""CPU use of the compute phases and the cpu-oversubscribed finding, on crafted step records."""

import pytest

from scaletrain.analysis import analyze_run, load_records, steady
from scaletrain.analysis.cpu import cpu_stats, run_device, utilisation
from test_analysis import RECORDED

CPU = {"device": "cpu"}


def _steps(n=24, forward=(0.1, 0.19), backward=(0.2, 0.38), comm=0.0, threads=2, slow_forward=None):
    """One rank's records: forward/backward as (wall, cpu); every 4th forward `slow_forward` s (same
    share of CPU) when given."""
    records = []
    for i in range(n):
        fw, fw_cpu = forward
        if slow_forward is not None and i % 4 == 0:
            fw, fw_cpu = slow_forward, slow_forward * fw_cpu / fw
        wall = {"data_wait": 0.005, "h2d": 0.0, "forward": fw, "backward": backward[0], "comm_exposed": comm,
                "optimizer": 0.01, "other": 0.001}
        cpu = {**dict.fromkeys(wall, 0.0), "forward": fw_cpu, "backward": backward[1], "optimizer": 0.01 * threads}
        records.append({"step": i, "epoch": 0, "step_in_epoch": i, "step_time_s": sum(wall.values()),
                        "phases_s": wall, "phases_cpu_s": cpu, "cpu_time_s": sum(cpu.values()), "threads": threads,
                        "comm_total_s": comm, "comm_hidden_s": 0.0, "overlap_ratio": 0.0 if comm else None,
                        "bytes_sent": 0})
    return records


def _kinds(result):
    return [f["kind"] for f in result["diagnosis"]]


def _finding(result, kind="cpu-oversubscribed"):
    return next(f for f in result["diagnosis"] if f["kind"] == kind)


def test_utilisation_is_cpu_time_over_wall_times_threads():
    used = utilisation({0: _steps(forward=(0.1, 0.03), backward=(0.2, 0.08))[5:]}, CPU)
    assert used["forward"] == pytest.approx(0.15)  # 0.03 s of 2 x 0.1 s
    assert used["backward"] == pytest.approx(0.2)  # 0.08 s of 2 x 0.2 s
    assert used["optimizer"] == pytest.approx(1.0)
    assert used["forward+backward"] == pytest.approx(0.11 / 0.6)


def test_threads_per_rank_from_the_config_wins_over_the_records():
    used = utilisation({0: _steps(forward=(0.1, 0.2), threads=4)}, {**CPU, "threads_per_rank": 2})
    assert used["forward"] == pytest.approx(1.0)


def test_starved_compute_phases_are_cpu_oversubscribed():
    result = analyze_run({0: _steps(forward=(0.1, 0.03), backward=(0.2, 0.08))}, {**CPU, "testbed": True})
    assert _kinds(result)[0] == "cpu-oversubscribed"
    finding = _finding(result)
    assert finding["evidence"] == ["cpu_time"]
    assert finding["message"] == "forward+backward used 18% of their 2 threads' CPU time"
    assert "--cores-per-host" in finding["lever"] and "--threads (now 2)" in finding["lever"]
    assert finding["share"] == pytest.approx(0.31 / 0.316)  # forward + backward + optimizer of the step
    assert result["cpu"]["utilisation"]["forward"] == pytest.approx(0.15)


def test_a_healthy_run_is_not_oversubscribed():
    result = analyze_run({0: _steps(), 1: _steps()}, {**CPU, "local_world_size": 1, "threads_per_rank": 2,
                                                      "cpu_cores": 2})
    assert _kinds(result) == ["compute-bound"]
    assert result["cpu"]["utilisation"]["forward+backward"] == pytest.approx(0.95)


def test_more_threads_than_cores_is_raised_from_the_config_alone():
    config = {**CPU, "local_world_size": 2, "threads_per_rank": 2, "cpu_cores": 2}
    finding = _finding(analyze_run({0: _steps(), 1: _steps()}, config))
    assert finding["evidence"] == ["threads"]
    assert finding["message"] == "2 ranks x 2 threads on 2 cores: more busy threads than cores, so they take turns"
    assert finding["lever"].startswith("--threads 1 so that ranks x threads <= cores (2 x 1 <= 2)")
    crowded = _finding(analyze_run({0: _steps()}, {**config, "local_world_size": 4, "threads_per_rank": 1}))
    assert "--nproc 2 --threads 1" in crowded["lever"]
    assert "cpu-oversubscribed" not in _kinds(analyze_run({0: _steps()}, CPU))  # keys absent: no check


def test_the_reported_case_names_threads_cpu_time_and_spread():
    # 2 ranks x 2 threads on 2 cores; forward 36 ms in most steps, 379 ms in some; threads half starved
    steps = _steps(forward=(0.036, 0.036), backward=(0.08, 0.08), slow_forward=0.379)
    config = {**CPU, "local_world_size": 2, "threads_per_rank": 2, "cpu_cores": 2}
    finding = _finding(analyze_run({0: steps, 1: steps}, config))
    assert finding["evidence"] == ["threads", "cpu_time", "spread"]
    assert finding["message"] == ("2 ranks x 2 threads on 2 cores: forward+backward used 50% of their 2 threads' "
                                  "CPU time, and forward p90 is 10.5x its p10 (379.0 ms vs 36.0 ms, rank 0)")


def test_a_spread_counts_only_when_it_matters_to_the_step():
    noisy_sliver = _steps(forward=(0.001, 0.002), slow_forward=0.005)  # 5x, but 4 ms of a 0.2 s step
    assert "cpu-oversubscribed" not in _kinds(analyze_run({0: noisy_sliver}, CPU))
    assert analyze_run({0: noisy_sliver}, CPU)["cpu"]["spread"]["forward"]["ratio"] == pytest.approx(5)
    jumpy = _steps(forward=(0.05, 0.1), slow_forward=0.2)
    assert _finding(analyze_run({0: jumpy}, CPU))["evidence"] == ["spread"]


def test_communication_measured_while_oversubscribed_comes_after_it_and_says_so():
    starved = _steps(forward=(0.1, 0.03), backward=(0.1, 0.03), comm=0.3)  # comm: 58% of a step
    result = analyze_run({0: starved}, CPU)
    assert _kinds(result) == ["cpu-oversubscribed", "communication-bound"]
    comm = _finding(result, "communication-bound")
    assert comm["share"] > result["diagnosis"][0]["share"]  # larger, and still not the headline
    assert "likely inflated by the CPU oversubscription" in comm["message"]
    assert comm["inflated_by"] == "cpu-oversubscribed"
    alone = analyze_run({0: _steps(comm=0.3)}, CPU)
    assert _kinds(alone) == ["communication-bound"] and "inflated" not in alone["diagnosis"][0]["message"]


def test_gpu_runs_never_get_it():
    starved = {0: _steps(forward=(0.1, 0.03), backward=(0.2, 0.08))}
    for config, memory in (({"device": "cuda"}, None), ({"device": "auto"}, [(0, 1, "cuda")])):
        result = analyze_run(starved, {**config, "local_world_size": 8, "threads_per_rank": 8, "cpu_cores": 2},
                             memory=memory)
        assert result["cpu"] is None and "cpu-oversubscribed" not in _kinds(result)
    assert run_device({"device": "auto"}, "rss") == "cpu" and run_device({}, None) is None


def test_runs_recorded_without_cpu_time_skip_the_cpu_checks():
    records = load_records(RECORDED)  # recorded before CPU time was: no phases_cpu_s, cpu_time_s, threads
    stats = cpu_stats({r: steady(recs) for r, recs in records.items()}, CPU)
    assert stats["utilisation"] is None and stats["cpu_time_mean_s"] is None  # not 0
    assert stats["spread"]["forward"]["ratio"] > 1
    result = analyze_run(records, CPU)
    assert "cpu-oversubscribed" not in _kinds(result)
    assert analyze_run(records, {})["cpu"] is None  # device unknown: nothing said
