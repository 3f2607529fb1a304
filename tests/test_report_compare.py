"""report.compare: which phase changed most between two runs; studies matched point by point."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaletrain.report import compare
from scaletrain.report.load import load_run, load_study, overview

DATA = Path(__file__).parent / "data"


def ov(name: str) -> dict:
    return overview(load_run(DATA / name))


def test_backward_is_named_as_the_largest_change():
    cmp = compare.compare_runs(ov("run-a"), ov("run-b"))
    assert cmp["largest_phase"] == "backward"
    assert cmp["verdict"] == "backward: 41.2 ms -> 23.9 ms per step (-42%), the largest change"
    rows = {r.label: r for r in cmp["rows"]}
    assert rows["data wait"].delta == pytest.approx(0.0005)  # changed too, but less
    step = rows["step time (mean)"]  # B: 73.0 - 17.3 (backward) + 0.5 (data wait) = 56.2 ms
    assert (step.a, step.b) == (pytest.approx(0.0730), pytest.approx(0.0562))
    assert step.relative == pytest.approx(-16.8 / 73.0)
    assert rows["top-1"].a == 0.91 and rows["top-1"].b == 0.92


def test_the_other_direction_says_slower():
    cmp = compare.compare_runs(ov("run-b"), ov("run-a"))
    assert cmp["verdict"].startswith("backward: 23.9 ms -> 41.2 ms per step (+72%)")


def test_without_phases_the_verdict_says_so():
    cmp = compare.compare_runs(ov("run-a"), ov("run-noprofile"))
    assert cmp["largest_phase"] is None
    assert "phases were not recorded in B (--profile off)" in cmp["verdict"]
    assert "step time: 73.0 ms -> " in cmp["verdict"]


def test_identical_runs():
    a = ov("run-a")
    assert compare.compare_runs(a, a)["verdict"].startswith("no phase changed")


def test_row_delta_and_relative():
    assert compare.Row("x", "time", 2.0, 1.0).relative == -0.5
    assert compare.Row("x", "time", 0.0, 1.0).relative is None and compare.Row("x", "time", 0.0, 1.0).delta == 1.0
    assert compare.Row("x", "time", None, 1.0).delta is None


def test_studies_matched_by_axes():
    a, b = load_study(DATA / "study-a"), load_study(DATA / "study-b")
    cmp = compare.compare_studies(a.points, list(reversed(b.points)), a.axes)  # order must not matter
    assert len(cmp["rows"]) == 6
    row = next(r for r in cmp["rows"] if r["axes"] == {"nproc": 2, "workers": 2})
    assert (row["epoch_time"].a, row["epoch_time"].b) == (16.0, 14.0)
    assert row["speedup"].a == pytest.approx(30 / 16) and row["speedup"].b == pytest.approx(27 / 14)
    failed = next(r for r in cmp["rows"] if r["axes"] == {"nproc": 4, "workers": 2})
    assert failed["status"] == "failed" and failed["status_b"] == "completed" and failed["epoch_time"].relative is None
    assert cmp["verdict"].startswith("nproc=2, workers=2: epoch time 16.00 s -> 14.00 s (-12%), the largest change")


def test_points_only_in_one_study():
    a = load_study(DATA / "study-a")
    extra = {"id": "nproc8-workers0", "axes": {"nproc": 8, "workers": 0}, "status": "completed", "epoch_time_s": 9.0}
    cmp = compare.compare_studies(a.points[:5], [*a.points, extra], a.axes)
    assert cmp["rows"][-1]["status"] == "absent"
    assert cmp["verdict"].endswith("; 2 points only in B")
    assert compare.compare_studies(a.points, a.points[:4], a.axes)["verdict"].endswith("; 2 points only in A")


# ------------------------------------------------------------------ configuration differences

def test_config_differences_in_key_order_with_absent_as_none():
    a = {"model": "lenet5", "nproc": 1, "precision": "fp32", "lr": 0.1}
    b = {"model": "lenet5", "nproc": 2, "precision": "bf16", "lr": 0.1, "threads": 1}
    assert compare.config_differences(a, b) == [("nproc", 1, 2), ("precision", "fp32", "bf16"), ("threads", None, 1)]
    assert compare.config_differences(a, dict(a)) == []


def test_run_settings_leave_out_where_a_run_was_written_and_add_how_it_ran():
    config = {"model": "lenet5", "nproc": 2, "out": "/tmp/p1", "resume": False, "progress": False}
    summary = {"model": "lenet5", "world_size": 2, "threads_per_rank": 1, "cpu_cores": 2, "torch_version": "2.13"}
    assert compare.run_settings(config, summary) == {"model": "lenet5", "nproc": 2, "threads_per_rank": 1,
                                                      "cpu_cores": 2, "torch_version": "2.13"}
    # no config.toml: what summary.json says of the configuration
    assert compare.run_settings({}, {"model": "mlp", "precision": "bf16", "world_size": 4}) == \
        {"model": "mlp", "precision": "bf16", "world_size": 4}
    assert compare.run_settings({}, None) == {}


def test_study_settings_are_the_axes_the_shared_settings_and_repeats():
    points = [{"axes": {"nproc": n}, "config": {"nproc": n, "model": "mlp", "epochs": 1, "lr": lr}}
              for n, lr in ((1, 0.1), (2, 0.2))]
    assert compare.study_settings(points, {"axes": {"nproc": [1, 2]}, "repeats": 2}) == \
        {"nproc (axis)": [1, 2], "model": "mlp", "epochs": 1, "repeats": 2}  # lr differs between points: not shared
    assert compare.study_settings([], {"axes": {"nproc": [1]}, "train": {"epochs": 3, "out": "x"}}) == \
        {"nproc (axis)": [1], "epochs": 3}


def test_compare_carries_the_differences_when_given_settings():
    a, b = load_run(DATA / "run-a"), load_run(DATA / "run-b")
    settings = (compare.run_settings(a.config, a.summary), {**compare.run_settings(b.config, b.summary), "nproc": 1})
    cmp = compare.compare_runs(overview(a), overview(b), settings)
    assert cmp["config"] == [("nproc", 2, 1)]
    assert compare.compare_runs(overview(a), overview(b))["config"] is None  # not compared, not "the same"
    sa, sb = load_study(DATA / "study-a"), load_study(DATA / "study-b")
    same = compare.compare_studies(sa.points, sb.points, sa.axes, (compare.study_settings(sa.points, sa.spec),
                                                                   compare.study_settings(sb.points, sb.spec)))
    assert same["config"] == []
