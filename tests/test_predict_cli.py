"""`scaletrain predict`, `calibrate` and `validate` end to end: files, report, scaling, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scaletrain.cli import main
from scaletrain.predict import calibration

from predict_fixtures import fake_calibration


@pytest.fixture
def cal_file(tmp_path):
    return calibration.save(fake_calibration(), tmp_path / "cal.json")


def _predict(cal_file, out, *flags):
    return main(["predict", "--calibration", str(cal_file), "--out", str(out), "--dataset", "synthetic",
                 "--synthetic-samples", "512", "--image-size", "32", *flags])


def test_predict_writes_every_point_with_the_profilers_phases(cal_file, tmp_path):
    out = tmp_path / "pred"
    assert _predict(cal_file, out, "--model", "resnet20,lenet5", "--nproc", "1,2,4", "--batch-size", "32") == 0
    p = json.loads((out / "prediction.json").read_text())
    assert p["kind"] == "prediction" and p["basis"] == "calibration" and len(p["points"]) == 6
    for point in p["points"]:
        assert set(point["phases_s"]) == {"data_wait", "h2d", "forward", "backward", "comm_exposed", "optimizer",
                                          "other"}
        assert point["step_time_s"] == pytest.approx(sum(point["phases_s"].values()))
        assert point["epoch_time_s"] >= point["steps_per_epoch"] * point["step_time_s"]
        assert point["limit"] in ("compute", "communication", "small-batch", "input")
        assert point["peak_memory_bytes"] == sum(point["memory_bytes"].values())
    one = next(q for q in p["points"] if q["axes"]["nproc"] == 1 and q["axes"]["model"] == "resnet20")
    two = next(q for q in p["points"] if q["axes"]["nproc"] == 2 and q["axes"]["model"] == "resnet20")
    assert one["speedup"] == 1.0 and two["ideal_speedup"] == 2.0
    assert two["comm"]["buckets"] >= 1 and two["phases_s"]["comm_exposed"] > 0
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    assert (out / "report.html").is_file() and list((out / "plots").glob("*.png"))
    assert p["regression"] and all(v["points"] > 0 for v in p["regression"].values())
    ops = one["ops"]  # each op says whether its time was measured or predicted by the regression
    assert {o["source"] for o in ops} <= {"measured", "regression"} and {o["kind"] for o in ops} >= {"conv", "norm"}
    assert sum(o["source"] == "measured" for o in ops) == one["layers"]["measured"]


def test_strong_scaling_splits_the_global_batch(cal_file, tmp_path, capsys):
    out = tmp_path / "strong"
    assert _predict(cal_file, out, "--model", "lenet5", "--nproc", "1,2", "--global-batch", "64") == 0
    lines = capsys.readouterr().out.splitlines()  # a log's lines as the points are traced and priced
    what = "predict: tracing the model and pricing each point"
    assert lines[0] == f"{what} ..." and lines[1].startswith(f"{what}: 1/2 (nproc1")
    assert any(line.startswith(f"{what}: done in ") for line in lines)
    points = json.loads((out / "prediction.json").read_text())["points"]
    assert [q["config"]["batch_size"] for q in points] == [64, 32]


def test_a_link_between_nodes_slows_communication_and_names_the_limit(cal_file, tmp_path):
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    flags = ("--model", "resnet20", "--nproc", "1", "--nnodes", "1,2,4", "--batch-size", "32")
    assert _predict(cal_file, fast, *flags, "--link", "100gbit") == 0
    assert _predict(cal_file, slow, *flags, "--link", "10mbit", "--latency", "1ms") == 0
    f = json.loads((fast / "prediction.json").read_text())
    s = json.loads((slow / "prediction.json").read_text())
    assert s["points"][1]["phases_s"]["comm_exposed"] > 10 * f["points"][1]["phases_s"]["comm_exposed"]
    assert s["points"][2]["limit"] == "communication"
    assert s["scaling"]["first_limit"] == "communication" and s["scaling"]["efficiency_below_50_at"] is not None


@pytest.fixture
def cached_cal(tmp_path, monkeypatch):
    """This machine's calibration in the cache (what --hardware predictions read for the rest of the step)."""
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))
    return calibration.save(fake_calibration(), calibration.cache_path())


def test_a_hardware_profile_predicts_from_its_data_sheet(cached_cal, tmp_path):
    out = tmp_path / "hw"
    assert main(["predict", "--out", str(out), "--dataset", "synthetic", "--synthetic-samples", "2048",
                 "--image-size", "32", "--model", "resnet20", "--nproc", "8", "--nnodes", "1,2", "--batch-size", "64",
                 "--hardware", "dgx-a100-80gb"]) == 0
    p = json.loads((out / "prediction.json").read_text())
    assert p["basis"] == "datasheet" and "data sheet" in p["basis_note"]
    assert all(q["layers"]["roofline"] > 0 for q in p["points"])


def test_bad_input_is_one_line_and_exit_2(cal_file, cached_cal, tmp_path, capsys):
    old = fake_calibration()
    old["format"] = 0
    stale = calibration.save(old, tmp_path / "old.json")
    bad_hw = tmp_path / "hw.toml"
    bad_hw.write_text('format = 1\nname = "x"\nsource = "y"\n[device]\nkind = "cuda"\ncount = 1\n')
    cases = [(["--calibration", str(stale), "--model", "lenet5"], "format 0"),
             (["--calibration", str(cal_file), "--model", "lenet5", "--nproc", "0"], "--nproc 0"),
             (["--model", "lenet5", "--hardware", str(bad_hw)], "is missing"),
             (["--calibration", str(cal_file), "--model", "tests.no_such:factory"], "cannot import"),
             (["--calibration", str(cal_file), "--model", "lenet5", "--precision", "bf16"], "no bf16"),
             (["--calibration", str(cal_file), "--model", "lenet5", "--link", "fast"], "--link")]
    for flags, words in cases:
        code = main(["predict", "--out", str(tmp_path / "x"), "--dataset", "synthetic", *flags])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.count("\n") == 0 and words in err, (flags, err)


def test_an_untraceable_model_that_cannot_run_either_is_one_line(cal_file, tmp_path, capsys):
    code = _predict(cal_file, tmp_path / "x", "--model", "test_predict_cli:broken")
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "forward fails" in err


def broken(num_classes=10, in_channels=3, image_size=32):
    from torch import nn

    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(7, num_classes)

        def forward(self, x):
            if x.sum() > 0:
                return x
            return self.fc(x)  # 32 != 7: the forward fails

    return Broken()


def test_validate_lines_a_prediction_up_with_runs(cal_file, tmp_path):
    out = tmp_path / "pred"
    assert _predict(cal_file, out, "--model", "lenet5", "--nproc", "1", "--batch-size", "32") == 0
    point = json.loads((out / "prediction.json").read_text())["points"][0]
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in point["config"].items()
                                               if v is not None and not isinstance(v, dict)) + "\n")
    measured = 1.25 * point["step_time_s"]
    (run / "summary.json").write_text(json.dumps({"status": "completed", "step_time_mean_s": measured,
                                                  "phases_mean_s": point["phases_s"], "samples_per_s": 1.0}))
    assert main(["validate", str(out), str(run), "--out", str(tmp_path / "v")]) == 0
    v = json.loads((tmp_path / "v" / "validation.json").read_text())
    assert v["summary"]["count"] == 1 and v["points"][0]["errors"]["step_time"] == pytest.approx(-0.2)


def test_calibrating_is_said_in_a_log(tmp_path, monkeypatch, capsys):
    """Output that is not a terminal (captured here; a SLURM log, nohup) gets lines, not a bar nobody sees:
    calibrate's parts as they are measured (no ETA: they differ in cost)."""
    from scaletrain.predict import calibrate

    def measured(*, quick, device, cores, work_dir, progress):
        for i, what in enumerate(["layers fp32 1t linear", "optimizer sgd 1t", "loop refnet 1 rank(s), batch 32"]):
            progress(what, i + 1, 3)
        return fake_calibration()

    monkeypatch.setattr(calibrate, "calibrate", measured)
    assert main(["calibrate", "--quick", "--device", "cpu", "--out", str(tmp_path / "cal.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "calibrate (quick, cpu) ..."
    assert lines[1].startswith("calibrate (quick, cpu): 1/3 (layers fp32 1t linear), ") and "ETA" not in lines[1]
    assert any(line.startswith("calibrate (quick, cpu): done in ") for line in lines)


@pytest.mark.slow
def test_calibrate_quick_then_predict_a_study_run_it_and_validate(tmp_path):
    cal = tmp_path / "cal.json"
    run = lambda *a: subprocess.run([sys.executable, "-m", "scaletrain", *a], capture_output=True, text=True)  # noqa
    r = run("calibrate", "--quick", "--out", str(cal))
    assert r.returncode == 0, r.stderr
    data = json.loads(cal.read_text())
    assert data["layers"] and data["network"]["fits"] and all("error" not in x for x in data["loop"]["runs"])
    assert {r["model"] for r in data["loop"]["runs"]} == {"refnet", "plain", "memory"}
    assert set(data["network"]["fits"]) == {"allreduce", "ring", "ps", "halo", "fp16", "bf16"}
    # each strategy's own host work at each thread count (Strategy.host_work)
    assert set(data["host_work"]) == {"ps", "fsdp", "ddp"}
    assert {r["threads"] for r in data["host_work"]["fsdp"]} == set(data["threads"])
    # what each collective takes of the host's cores, fitted beside its time (what hiding it costs backward)
    assert all(data["network"]["fits"][k]["cpu_beta_s_per_byte"] > 0 for k in ("allreduce", "ring", "ps"))
    pages = data["memory"]["fresh_pages"]  # (lean's huge pages can cost next to nothing)
    assert pages["steady"]["seconds_per_byte"] > 0 and pages["lean"]["seconds_per_byte"] >= 0
    assert set(data["probe"]["mean_s"]) == {str(t) for t in data["threads"]} == set(data["probe"]["loop_mean_s"])
    study = tmp_path / "study"
    r = run("study", "--model", "lenet5", "--nproc", "1,2", "--dataset", "synthetic", "--synthetic-samples", "1024",
            "--batch-size", "32", "--epochs", "1", "--out", str(study), "--predict", "--calibration", str(cal))
    assert r.returncode == 0, r.stderr
    v = json.loads((study / "validation" / "validation.json").read_text())
    assert v["summary"]["count"] == 2
    assert v["summary"]["max_abs_error"] < 1.0  # a quick calibration: within a factor of two on every point
