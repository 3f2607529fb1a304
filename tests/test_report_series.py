"""report.series: what the plots draw, from records and study points."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaletrain.report import series
from scaletrain.report.load import load_run, load_study

DATA = Path(__file__).parent / "data"


def test_phase_names_in_step_order_unknown_last():
    assert series.phase_names([{"other": 1, "zeta": 1, "forward": 1}, None, {"data_wait": 1, "alpha": 1}]) == \
        ["data_wait", "forward", "other", "alpha", "zeta"]


def test_step_times_per_rank():
    lines = series.step_times(load_run(DATA / "run-a").records)
    assert list(lines) == [0, 1]
    assert lines[1].label == "rank 1" and lines[1].xs == list(range(12))
    assert lines[0].ys[0] == pytest.approx(0.123) and lines[0].ys[1] == pytest.approx(0.073)


def test_phase_shares_add_up_to_one_per_step():
    steps, shares = series.phase_shares(load_run(DATA / "run-a").records)
    assert steps == list(range(12)) and next(iter(shares)) == "data_wait"
    for i in range(len(steps)):
        assert sum(s[i] for s in shares.values()) == pytest.approx(1.0)
    assert shares["backward"][1] == pytest.approx(0.0412 / 0.073)


def test_no_phase_shares_without_profiling():
    assert series.phase_shares(load_run(DATA / "run-noprofile").records) is None


def test_study_lines_one_per_series_failed_points_left_out():
    study = load_study(DATA / "study-a")
    lines = series.study_lines(study.points, study.axes, "nproc", "epoch_time_s")
    assert [(line.label, line.xs, line.ys) for line in lines] == [
        ("workers=0", [1, 2, 4], [40.0, 22.0, 13.0]), ("workers=2", [1, 2], [30.0, 16.0])]
    sweep = series.study_lines(study.points, study.axes, "workers", "epoch_time_s")
    assert [line.label for line in sweep] == ["nproc=1", "nproc=2", "nproc=4"] and sweep[2].xs == [0]


def test_study_lines_with_a_single_series():
    points = [{"axes": {"nproc": n, "model": "mlp"}, "speedup": s} for n, s in ((2, 1.9), (1, 1.0))]
    assert series.varying_axes(points, ["nproc", "model"]) == ["nproc"]
    [line] = series.study_lines(points, ["nproc", "model"], "nproc", "speedup")
    assert (line.label, line.xs, line.ys) == ("all points", [1, 2], [1.0, 1.9])


def test_ideal_line_drawn_once_when_baselines_agree():
    study = load_study(DATA / "study-a")
    [ideal] = series.ideal_lines(study.points, study.axes)
    assert (ideal.xs, ideal.ys) == ([1, 2, 4], [1.0, 2.0, 4.0])
    points = [{"axes": {"nproc": 2, "w": 0}, "ideal_speedup": 1.0},
              {"axes": {"nproc": 4, "w": 0}, "ideal_speedup": 2.0},
              {"axes": {"nproc": 2, "w": 1}, "ideal_speedup": 2.0}]  # series w=1 lost its nproc=1 baseline
    assert [line.label for line in series.ideal_lines(points, ["nproc", "w"])] == ["ideal (w=0)", "ideal (w=1)"]
