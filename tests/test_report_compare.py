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
