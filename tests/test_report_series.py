"""report.series: what the plots draw, from records and study points."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaletrain.report import series
from scaletrain.report.load import load_run, load_study
from scaletrain.report.series import Line

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


# ------------------------------------------------------------------ training curves

STEPS = {0: [{"step": s, "epoch": s // 2, "loss": 2.0 - 0.1 * s, "lr": 0.1 - 0.01 * s, "step_time_s": 0.1}
             for s in range(4)],
         1: [{"step": s, "epoch": s // 2, "loss": 9.0, "lr": 0.1, "step_time_s": 0.1} for s in range(4)]}
EPOCHS = [{"epoch": 0, "train_loss": 1.95, "lr": 0.1, "top1": 0.5, "top5": 0.9, "val_loss": 1.5},
          {"epoch": 1, "train_loss": 1.75, "lr": 0.08}]  # the second epoch was not evaluated


def test_training_curves_per_step_from_rank_0_and_per_epoch_counted_from_1():
    curves, notes = series.training_curves(STEPS, EPOCHS)
    by_name = {c.name: c for c in curves}
    assert list(by_name) == ["loss-per-step", "loss-per-epoch", "accuracy", "lr"] and notes == []
    assert by_name["loss-per-step"].lines == [Line("training loss (rank 0)", [0, 1, 2, 3], [2.0, 1.9, 1.8, 1.7])]
    assert not by_name["loss-per-step"].markers and by_name["loss-per-epoch"].markers
    train, val = by_name["loss-per-epoch"].lines
    assert (train.xs, train.ys, val.xs, val.ys) == ([1, 2], [1.95, 1.75], [1], [1.5])
    top1, top5 = by_name["accuracy"].lines
    assert (top1.label, top1.xs, top1.ys, top5.ys) == ("top-1", [1], [50.0], [90.0])
    assert by_name["lr"].xlabel == "step" and by_name["lr"].lines[0].ys == pytest.approx([0.1, 0.09, 0.08, 0.07])


def test_missing_fields_are_notes_never_empty_or_zero_curves():
    bare_steps = {0: [{"step": s, "step_time_s": 0.1} for s in range(3)]}
    curves, notes = series.training_curves(bare_steps, [])
    assert curves == []
    assert notes == ["training loss per step: not drawn, the metrics lines have no loss",
                     "loss per epoch: not drawn, epochs.jsonl has no train_loss or val_loss (no epoch finished)",
                     "validation accuracy: not drawn, no epoch was evaluated (epochs.jsonl has no top1 or top5)",
                     "learning rate: not drawn, neither the metrics lines nor epochs.jsonl have an lr"]
    # no per-step lr: the per-epoch one is drawn instead, and says so
    curves, _ = series.training_curves(bare_steps, [{"epoch": 0, "lr": 0.1}])
    assert [(c.name, c.xlabel, c.lines[0].ys) for c in curves] == [("lr", "epoch", [0.1])]


def test_non_finite_values_are_left_out_and_counted():
    steps = {0: [{"step": 0, "loss": float("nan"), "lr": 0.1}, {"step": 1, "loss": 1.0, "lr": float("inf")},
                 {"step": 2, "loss": 0.9, "lr": 0.1}]}
    curves, notes = series.training_curves(steps, [{"epoch": 0, "train_loss": float("nan"), "top1": 0.5}])
    by_name = {c.name: c for c in curves}
    assert by_name["loss-per-step"].lines[0].xs == [1, 2] and by_name["lr"].lines[0].xs == [0, 2]
    assert "loss-per-epoch" not in by_name
    assert notes[-1] == ("3 loss, accuracy or learning-rate values were not finite (nan or inf): left out of the "
                         "curves")
