"""scaletrain validate: matching runs to predicted points, the error arithmetic, the summary, the files, bad input."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from PIL import Image

from scaletrain.errors import UserError
from scaletrain.validate import MeasuredRun, load_measured, load_prediction, validate
from scaletrain.validate.cli import add_validate_args, run_validate
from scaletrain.validate.match import error_summary, quantile, summary_line

BASE = {"model": "resnet20", "dataset": "synthetic", "batch_size": 64, "nproc": 1, "nnodes": 1, "workers": 0,
        "precision": "fp32", "strategy": "allreduce", "compress": "none", "ps_servers": 1, "image_size": 32,
        "threads": 1, "bucket_cap_mb": None}
PHASES = {"data_wait": 0.001, "h2d": 0.0005, "forward": 0.03, "backward": 0.06, "comm_exposed": 0.004,
          "optimizer": 0.003, "other": 0.0015}  # a 0.1 s step


def point(pid: str, step: float = 0.1, phases: dict | None = None, **config) -> dict:
    return {"id": pid, "axes": {"nproc": config.get("nproc", 1)}, "config": {**BASE, **config},
            "phases_s": phases or PHASES, "step_time_s": step, "epoch_time_s": 10 * step, "samples_per_s": 640.0,
            "peak_memory_bytes": 1_000_000, "speedup": 1.0, "efficiency": 1.0, "limit": "compute",
            "limit_note": "forward and backward take 90% of the step"}


def prediction(*points: dict, basis: str = "calibration") -> dict:
    return {"format": 1, "kind": "prediction", "scaletrain_version": "0.1.0", "basis": basis,
            "basis_note": "calibration of this machine (cal.json)", "axes": {"nproc": [1, 2]}, "points": list(points),
            "scaling": {"first_limit": "communication", "notes": []}}


def toml_value(v) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else json.dumps(v) if isinstance(v, str) else repr(v)


def write_run(root: Path, config: dict, step: float | None = 0.1, phases: dict | None = None, status="completed",
              memory: float | None = 1_100_000, kind: str = "rss", summary: bool = True, **extra) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.toml").write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in config.items() if v is not None))
    if summary:
        (root / "summary.json").write_text(json.dumps({
            "status": status, "step_time_mean_s": step, "phases_mean_s": phases or PHASES, "samples_per_s": 600.0,
            "peak_memory_bytes": memory, "memory_kind": kind, "epoch_times_s": [1.0], **extra}))
    return root


def measured(step: float = 0.1, phases: dict | None = None, name: str = "r", **config) -> MeasuredRun:
    return MeasuredRun(run_dir=name, config={**BASE, **config}, step_time_s=step, phases_s=phases or PHASES,
                       samples_per_s=600.0, peak_memory_bytes=1_100_000, memory_kind="rss")


# ---- matching ----

def test_runs_match_on_the_settings_with_none_compress_and_absent_nnodes_normalised():
    pred = prediction(point("nproc1"), point("nproc2", nproc=2))
    loose = {k: v for k, v in BASE.items() if k != "nnodes"} | {"compress": None, "nproc": 2}
    run = MeasuredRun("runs/a", loose, 0.1, PHASES)
    result = validate(pred, [run])
    assert [p["id"] for p in result["points"]] == ["nproc2"]
    assert result["points"][0]["run_dirs"] == ["runs/a"] and result["unmatched"] == []
    assert result["unmeasured_points"] == ["nproc1"]


def test_a_setting_the_point_does_not_give_is_not_compared():
    sparse = point("p")
    del sparse["config"]["workers"], sparse["config"]["image_size"]
    result = validate(prediction(sparse), [measured(workers=4, image_size=64)])
    assert [p["id"] for p in result["points"]] == ["p"]


def test_an_unmatched_run_names_the_nearest_point_and_how_it_differs():
    pred = prediction(point("nproc1"), point("nproc2", nproc=2))
    result = validate(pred, [measured(nproc=4, precision="bf16", name="runs/x")])
    assert result["points"] == []
    (u,) = result["unmatched"]
    assert u["run_dir"] == "runs/x" and u["nearest"] == "nproc1"
    assert {d["key"] for d in u["differs"]} == {"nproc", "precision"}


def test_repeats_of_a_point_are_averaged_and_ties_go_to_the_closer_config():
    a, b = point("threads1"), point("threads2", threads=2)
    result = validate(prediction(a, b), [measured(0.1, threads=2, name="r0"), measured(0.12, threads=2, name="r1")])
    (p,) = result["points"]
    assert p["id"] == "threads2" and p["run_dirs"] == ["r0", "r1"]
    assert p["measured"]["step_time_s"] == pytest.approx(0.11)


# ---- the errors ----

def test_error_arithmetic():
    phases = {**PHASES, "h2d": 0.001, "forward": 0.025}  # h2d 1% of the step: no relative error
    pred = prediction(point("p", step=0.11, phases=phases))
    (p,) = validate(pred, [measured(0.1)])["points"]
    e = p["errors"]
    assert e["step_time"] == pytest.approx(0.10)
    assert e["samples_per_s"] == pytest.approx(640 / 600 - 1)
    assert e["peak_memory"] == pytest.approx(1_000_000 / 1_100_000 - 1)
    assert e["phases"]["forward"]["relative"] == pytest.approx(-5 / 30)
    assert e["phases"]["forward"]["difference_s"] == pytest.approx(-0.005)
    assert e["phases"]["h2d"]["relative"] is None  # measured 0.5 ms of a 100 ms step
    assert e["phases"]["h2d"]["difference_s"] == pytest.approx(0.0005)
    assert e["phases"]["backward"]["relative"] == 0.0


def test_peak_memory_is_compared_only_for_the_same_kind():
    gpu = point("p") | {"memory_kind": "cuda"}
    result = validate(prediction(gpu), [measured()])
    (p,) = result["points"]
    assert p["errors"]["peak_memory"] is None and p["measured"]["memory_kind"] == "rss"
    assert any("peak memory not compared" in n for n in result["notes"])


def test_median_p90_and_shares_within():
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    errors = [0.01, -0.02, 0.03, 0.04, -0.05, 0.06, 0.07, 0.08, 0.09, -0.10]
    s = error_summary(errors)
    assert s["count"] == 10
    assert s["median_abs_error"] == pytest.approx(0.055)
    assert s["p90_abs_error"] == pytest.approx(0.091)
    assert s["max_abs_error"] == pytest.approx(0.10)
    assert s["mean_signed_error"] == pytest.approx(0.021)
    assert s["within_5pct"] == 0.5 and s["within_10pct"] == 1.0
    assert summary_line(s) == "step time: median |error| 5.5%, p90 9.1% over 10 points; 7 over, 3 under"
    assert error_summary([])["median_abs_error"] is None


# ---- reading runs and studies ----

def study(root: Path, points: list[tuple[str, dict, list[str]]]) -> Path:
    root.mkdir(parents=True)
    entries = [{"id": pid, "axes": {"nproc": cfg.get("nproc", 1)}, "config": cfg, "runs": runs, "status": "completed"}
               for pid, cfg, runs in points]
    (root / "study.json").write_text(json.dumps(entries))
    return root


def test_a_study_gives_every_usable_repeat_and_notes_the_rest(tmp_path):
    two = {**BASE, "nproc": 2}
    s = study(tmp_path / "s", [("nproc1", BASE, ["points/nproc1/r0", "points/nproc1/r1"]),
                               ("nproc2", two, ["points/nproc2/r0", "points/nproc2/r1", "points/nproc2/r2"])])
    write_run(s / "points/nproc1/r0", BASE, step=0.1)
    write_run(s / "points/nproc1/r1", BASE, step=0.12)
    write_run(s / "points/nproc2/r0", two, step=0.06)
    write_run(s / "points/nproc2/r1", two, status="failed", error="rank 1 died")
    write_run(s / "points/nproc2/r2", two, summary=False)
    notes: list[str] = []
    runs = load_measured([s, s / "points/nproc1/r0"], notes)  # the run given twice counts once
    assert sorted(r.run_dir for r in runs) == [str(s / "points/nproc1/r0"), str(s / "points/nproc1/r1"),
                                               str(s / "points/nproc2/r0")]
    assert {r.point for r in runs} == {"nproc1", "nproc2"}
    assert any("failed: rank 1 died: skipped" in n for n in notes)
    assert any("no summary.json" in n for n in notes)
    result = validate(prediction(point("nproc1", step=0.1), point("nproc2", step=0.066, nproc=2)), runs)
    by_id = {p["id"]: p for p in result["points"]}
    assert by_id["nproc1"]["measured"]["step_time_s"] == pytest.approx(0.11)
    assert by_id["nproc2"]["errors"]["step_time"] == pytest.approx(0.1)


def test_a_run_without_image_size_gets_its_datasets_default(tmp_path):
    run = write_run(tmp_path / "r", {k: v for k, v in BASE.items() if k != "image_size"} | {"dataset": "digits"})
    (m,) = load_measured([run])
    assert m.config["image_size"] == 32 and m.config["dataset"] == "digits"


# ---- the command ----

def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_validate_args(p)
    return p.parse_args(argv)


def test_the_command_writes_validation_json_and_plots_beside_the_prediction(tmp_path, capsys):
    pred_dir = tmp_path / "pred"
    pred_dir.mkdir()
    pred = prediction(point("nproc1", step=0.105), point("nproc2", step=0.2, nproc=2), point("nproc4", nproc=4),
                      basis="datasheet")
    pred["basis_note"] = "data sheet of the Example X1"
    (pred_dir / "prediction.json").write_text(json.dumps(pred))
    a = write_run(tmp_path / "a", BASE, step=0.1)
    b = write_run(tmp_path / "b", {**BASE, "nproc": 2}, step=0.25)
    c = write_run(tmp_path / "c", {**BASE, "nproc": 3}, step=0.3)
    assert run_validate(parse(str(pred_dir), str(a), str(b), str(c))) == 0
    out = capsys.readouterr().out
    assert "step time: median |error| 12.5%, p90 18.5% over 2 points" in out
    assert "data sheet of the Example X1" in out
    assert f"unmatched: {c}: nearest prediction point nproc1 differs in nproc (run 3, predicted 1)" in out
    assert "nproc4" in out  # not measured
    data = json.loads((pred_dir / "validation" / "validation.json").read_text())
    assert data["format"] == 1 and data["basis"] == "datasheet"
    assert [p["id"] for p in data["points"]] == ["nproc1", "nproc2"]
    assert set(data["points"][0]) >= {"id", "config", "run_dirs", "measured", "predicted", "errors"}
    assert data["summary"]["count"] == 2 and data["summary"]["max_abs_error"] == pytest.approx(0.2)
    for name in ("step-time.png", "phase-errors.png"):
        with Image.open(pred_dir / "validation" / "plots" / name) as im:
            assert im.format == "PNG"
    # --out elsewhere, and a prediction file given directly
    assert run_validate(parse(str(pred_dir / "prediction.json"), str(a), "--out", str(tmp_path / "v"))) == 0
    assert (tmp_path / "v" / "validation.json").is_file()


def test_a_wide_range_draws_a_log_log_scatter(tmp_path):
    from scaletrain.validate.plots import step_time_scatter

    pts = [{"id": f"p{i}", "measured": {"step_time_s": s}, "predicted": {"step_time_s": 1.08 * s}}
           for i, s in enumerate((0.001, 0.01, 0.1, 1.0))]
    with Image.open(step_time_scatter(pts, tmp_path / "s.png", "t")) as im:
        assert im.format == "PNG"


# ---- bad input: one line each ----

def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_bad_prediction_paths_and_files(tmp_path):
    with pytest.raises(UserError) as e:
        load_prediction(tmp_path / "nope.json")
    assert "does not exist" in one_line(e)
    with pytest.raises(UserError) as e:
        load_prediction(tmp_path)
    assert "holds no prediction.json" in one_line(e)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError) as e:
        load_prediction(bad)
    assert "not a prediction: not valid JSON" in one_line(e)
    bad.write_text(json.dumps({"format": 1, "kind": "validation", "points": []}))
    with pytest.raises(UserError) as e:
        load_prediction(bad)
    assert 'not a prediction (kind "validation"' in one_line(e)
    bad.write_text(json.dumps(prediction(point("p")) | {"format": 2}))
    with pytest.raises(UserError) as e:
        load_prediction(bad)
    assert "format 2" in one_line(e)
    broken = prediction(point("p"))
    broken["points"][0]["step_time_s"] = "fast"
    bad.write_text(json.dumps(broken))
    with pytest.raises(UserError) as e:
        load_prediction(bad)
    assert "step_time_s" in one_line(e)


def test_bad_measured_paths(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError) as e:
        load_measured([tmp_path / "empty"])
    assert "neither a run nor a study" in one_line(e)
    with pytest.raises(UserError) as e:
        load_measured([tmp_path / "missing"])
    assert "does not exist" in one_line(e)
    running = write_run(tmp_path / "running", BASE, summary=False)
    (running / "metrics-rank0.jsonl").write_text('{"step": 0, "step_time_s": 0.1}\n')
    with pytest.raises(UserError) as e:
        load_measured([running])
    assert "no usable run" in one_line(e) and "no summary.json" in one_line(e)


def test_nothing_matching_is_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "prediction.json").write_text(json.dumps(prediction(point("nproc1"))))
    run = write_run(tmp_path / "r", {**BASE, "batch_size": 32})
    with pytest.raises(UserError) as e:
        run_validate(parse(str(tmp_path), str(run)))
    assert "none of the 1 measured run(s) matches" in one_line(e)
    assert "batch_size (run 32, predicted 64)" in str(e.value)
    assert not (tmp_path / "validation").exists()
