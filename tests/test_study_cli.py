"""Tests for `scaletrain study`: flags to spec, the runner's pieces, rendering, and real studies through the CLI
(one point in the default suite, the command's smoke test; resume, failures and Ctrl-C under `slow`)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, assert_ok, scaletrain
from rich.console import Console

from scaletrain import report as report_package
from scaletrain.cli import build_parser, main
from scaletrain.config import TrainConfig, build_config
from scaletrain.errors import UserError
from scaletrain.study.cli import add_study_args, spec_from_args
from scaletrain.study.grid import resolve_spec
from scaletrain.distributed.env import JOIN_VARS
from scaletrain.rundir import StudyDir
from scaletrain.study.runner import check_study_dir, error_line, run_state, train_command, write_spec
from scaletrain.fmt import hms
from scaletrain.grid import rich_table
from scaletrain.study.view import flag_lines, plan_table, results_table

HAS_REPORT = hasattr(report_package, "write_study_report")  # helper B's; the study calls it at the end
CONTRACT_KEYS = {"id", "axes", "config", "runs", "status", "epoch_time_s", "epoch_time_std_s", "samples_per_s",
                 "speedup", "ideal_speedup", "efficiency", "baseline", "phases_mean_s", "overlap_ratio",
                 "diagnosis", "top1", "repeats"}
TINY = ["--model", "mlp", "--dataset", "digits", "--epochs", "1"]


def spec_of(*argv: str):
    return spec_from_args(build_parser().parse_args(["study", *argv]))


# ------------------------------------------------------------------ flags

def test_axis_flags_take_comma_lists_and_other_flags_fixed_values():
    spec = spec_of("--nproc", "1,2", "--workers", "0", "--model", "mlp", "--epochs", "1", "--lr", "0.05",
                   "--no-augment", "--out", "x")
    assert spec.axes == {"nproc": [1, 2], "workers": [0], "model": ["mlp"]}
    assert spec.train == {"epochs": 1, "lr": 0.05, "augment": False}
    assert spec.repeats == 1


def test_every_train_setting_is_a_study_flag_except_the_per_run_ones():
    p = argparse.ArgumentParser()
    add_study_args(p)
    opts = {s for a in p._actions for s in a.option_strings}
    for name in TrainConfig().to_dict():
        flag = "--" + name.replace("_", "-")
        assert (flag in opts) == (name not in ("resume", "progress", "stop_after")), flag  # --out: the study dir


def test_flags_override_the_study_file(tmp_path):
    conf = tmp_path / "s.toml"
    conf.write_text("repeats = 2\n[axes]\nnproc = [1, 2]\nworkers = [0, 1]\n[train]\nepochs = 3\n")
    spec = spec_of("--config", str(conf), "--workers", "2", "--epochs", "1", "--out", "x")
    assert spec.axes == {"nproc": [1, 2], "workers": [2]} and spec.train == {"epochs": 1} and spec.repeats == 2
    assert spec_of("--config", str(conf), "--repeats", "3", "--out", "x").repeats == 3


def test_bad_axis_value_is_one_line_and_exit_2_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["study", "--nproc", "1,2", "--workers", "0,x", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --workers 0,x") and "'x'" in err[0]
    assert not out.exists()


def test_a_bad_point_stops_the_study_before_launching(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["study", "--nproc", "1,2", "--epochs", "1", "--warmup-epochs", "2", "--out", str(out)]) == 2
    assert "study point nproc1 (nproc=1): --warmup-epochs" in capsys.readouterr().err
    assert not out.exists()


def test_a_point_that_cannot_run_stops_the_study_before_any_launch(tmp_path, capsys):
    out = tmp_path / "study"
    # lenet5 is fine; nosuchnet passes the config checks but names no model: found before lenet5 trains
    assert main(["study", "--model", "lenet5,nosuchnet", "--dataset", "digits", "--epochs", "1",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("error: study point nproc1-model_nosuchnet (nproc=1, dataset=digits, model=nosuchnet): "
                             "unknown model 'nosuchnet'")
    assert not out.exists()  # nothing launched, nothing written


def test_points_are_validated_once_per_model_data_and_shape(tmp_path, capsys, monkeypatch):
    import scaletrain.distributed.launch.preflight

    checked = []
    monkeypatch.setattr(scaletrain.distributed.launch.preflight, "validate",
                        lambda cfg: checked.append((cfg.launch.nproc, cfg.data.workers)))
    out = tmp_path / "study"
    assert main(["study", "--nproc", "1,2", "--workers", "0,2", *TINY, "--out", str(out), "--dry-run"]) == 0
    assert sorted(n for n, _ in checked) == [1, 2]  # the workers=2 twins need no second check
    assert not out.exists()


def test_dry_run_lists_the_points_and_launches_nothing(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["study", "--nproc", "1,2", "--precision", "fp32,bf16", *TINY, "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    for pid in ("nproc1-precision_fp32", "nproc2-precision_fp32", "nproc1-precision_bf16", "nproc2-precision_bf16"):
        assert pid in text
    assert "4 points x 1 repeat = 4 runs: 0 done, 4 to run; nothing launched" in text
    assert not out.exists()


def test_every_point_runs_the_same_threads_per_rank_and_the_plan_says_so(tmp_path, capsys, monkeypatch):
    import scaletrain.distributed.device
    import scaletrain.distributed.launch.preflight
    import scaletrain.study.cli

    monkeypatch.setattr(scaletrain.distributed.device, "machine_cores", lambda env=None: 2)
    monkeypatch.setattr(scaletrain.distributed.launch.preflight, "validate", lambda cfg: None)
    launched = []
    monkeypatch.setattr(scaletrain.study.cli, "_run_all", lambda console, study, spec, grid, runs:
                        launched.extend(train_command(p.config, study.run(p.id, 0)) for p in grid))
    out = tmp_path / "study"
    assert main(["study", "--nproc", "1,2", *TINY, "--out", str(out), "--dry-run"]) == 0
    line = "threads per rank: 1 (2 cores / 2 processes, the grid's largest; --threads to change)"
    assert line in capsys.readouterr().out
    main(["study", "--nproc", "1,2", *TINY, "--out", str(out)])
    assert line in capsys.readouterr().out  # with the table too
    assert [cmd[cmd.index("--threads") + 1] for cmd in launched] == ["1", "1"]
    assert "threads = 1" in (out / "study.toml").read_text()  # a resume keeps them, on any machine


# ------------------------------------------------------------------ runner pieces

def test_train_command_spells_out_the_point_and_its_run_dir(tmp_path):
    cfg = build_config({}, {"model": "mlp", "nproc": 2, "lr": 0.05, "augment": False})
    cmd = train_command(cfg, tmp_path / "r0")
    assert cmd[:4] == [sys.executable, "-m", "scaletrain", "train"]
    assert cmd[-2:] == ["--out", str(tmp_path / "r0")] and "--no-progress" not in cmd  # its log shows progress
    ns = build_parser().parse_args(cmd[3:])  # what train will parse: exactly the validated config
    assert {k: v for k, v in vars(ns).items() if k in cfg.to_dict() and k not in ("out", "progress")} == \
        {k: v for k, v in cfg.to_dict().items() if v is not None and k not in ("out", "progress", "resume")}


def test_a_study_in_a_log_follows_its_run_from_the_run_directory(capsys):
    from scaletrain.study.cli import _follow

    waiting = _follow(Console(highlight=False), "point 2/3  nproc=2", ROOT / "tests" / "data" / "run-a",
                      "points/nproc2/r0.log")
    waiting()  # the first poll: a line at once (then at console/pace.py's pace)
    assert capsys.readouterr().out == "point 2/3  nproc=2: epoch 2/2  step 12/12  100.0%  393 samples/s\n"


def test_error_line_prefers_the_summary_then_the_log():
    log = "$ python -m scaletrain train\nsome output\nerror: first\nerror: second problem\n"
    assert error_line(log, {"status": "failed", "error": "from summary"}, 2) == "from summary"
    assert error_line(log, None, 2) == "second problem"
    assert error_line("Traceback\nValueError: x\n", None, 1) == "train exited with code 1: ValueError: x"
    assert "status 'stopped'" in error_line("", {"status": "stopped"}, 0)


def test_run_state(tmp_path):
    run = tmp_path / "r0"
    assert run_state(run) == "new"
    run.mkdir()
    (run / "config.toml").write_text("")
    assert run_state(run) == "unfinished"
    (run / "summary.json").write_text('{"status": "fail')  # cut short by a kill
    assert run_state(run) == "unfinished"
    (run / "summary.json").write_text('{"status": "failed", "error": "interrupted"}')  # Ctrl-C: resumable
    assert run_state(run) == "unfinished"
    (run / "summary.json").write_text('{"status": "failed", "error": "interrupted (SIGTERM)"}')  # as train says now
    assert run_state(run) == "unfinished"
    (run / "summary.json").write_text('{"status": "failed", "error": "boom"}')
    assert run_state(run) == "failed"
    (run / "summary.json").write_text('{"status": "completed"}')
    assert run_state(run) == "completed"


def test_study_dir_checks(tmp_path):
    spec = resolve_spec(None, {"nproc": [1, 2]}, {"epochs": 1}, 1)
    assert check_study_dir(StudyDir(tmp_path / "new"), spec) is False
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        check_study_dir(StudyDir(tmp_path / "file"), spec)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("x")
    with pytest.raises(UserError, match="holds no study"):
        check_study_dir(StudyDir(tmp_path / "other"), spec)
    study = StudyDir(tmp_path / "study")
    write_spec(study, spec)
    assert check_study_dir(study, resolve_spec(None, {"nproc": [1, 2]}, {"epochs": 1}, 3)) is True
    with pytest.raises(UserError, match=r"different spec \(nproc: \[1, 2\] there, \[1, 4\] here\)"):
        check_study_dir(study, resolve_spec(None, {"nproc": [1, 4]}, {"epochs": 1}, 1))


# ------------------------------------------------------------------ rendering

def test_hms():
    assert (hms(None), hms(0.4), hms(61.5), hms(3723)) == ("-", "0:00:00", "0:01:02", "1:02:03")


def test_results_table_shows_std_scaling_and_diagnosis():
    e = {"axes": {"nproc": 2}, "status": "completed", "epoch_time_s": 2.0, "epoch_time_std_s": 0.1,
         "samples_per_s": 1234.0, "speedup": 1.6, "ideal_speedup": 2.0, "efficiency": 0.8,
         "diagnosis": [{"kind": "communication-bound"}]}
    console = Console(width=200, record=True)
    console.print(rich_table(results_table([e], ["nproc"], "t")))
    text = console.export_text()
    for needle in ("0:00:02", "±", "0.1", "1,234", "1.60x", "2.00x", "80%", "communication-bound"):
        assert needle in text
    assert "status" not in text  # all completed: no status column


def test_results_table_lists_threads_per_rank_and_flags_efficiency_above_one():
    base = {"id": "nproc1", "axes": {"nproc": 1}, "config": {"nproc": 1}, "status": "completed",
            "epoch_time_s": 40.0, "speedup": 1.0, "ideal_speedup": 1.0, "efficiency": 1.0, "baseline": "nproc1",
            "threads_per_rank": 2, "cpu_cores": 2}
    fast = {**base, "id": "nproc2", "axes": {"nproc": 2}, "config": {"nproc": 2}, "epoch_time_s": 40.0 / 11.02,
            "speedup": 11.02, "ideal_speedup": 2.0, "efficiency": 5.51, "threads_per_rank": 1}
    old = {**base, "id": "nproc4", "axes": {"nproc": 4}, "config": {"nproc": 4}, "threads_per_rank": None,
           "efficiency": 0.5}
    console = Console(width=200, record=True)
    console.print(rich_table(results_table([base, fast, old], ["nproc"], "t")))
    text = console.export_text()
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()[:1].isdigit()}
    assert "threads/rank" in text
    assert rows["1"][1] == "2" and rows["2"][1] == "1" and rows["4"][1] == "?"  # ? = not recorded
    assert "551% !" in " ".join(rows["2"])
    lines = flag_lines([base, fast, old])
    assert len(lines) == 1
    console = Console(width=400, record=True)
    console.print(lines[0])
    assert console.export_text().strip() == (
        "warning: efficiency 5.51 above 1.0 at nproc=2 (speedup 11.02x, ideal 2.00x): not a real speedup — the "
        "baseline (nproc=1) ran 2 threads/rank vs 1 here, or the machine was busy while the baseline ran; rerun "
        "with --threads 1 for every point")


def test_plan_table_says_what_each_point_needs():
    class P:
        id, axes = "nproc1", {"nproc": 1}
    console = Console(width=200, record=True)
    console.print(plan_table([P()], {"nproc1": ["completed", "unfinished"]}, 2, "t"))
    assert "r0: done, r1: rerun (unfinished)" in console.export_text()


# ------------------------------------------------------------------ real studies through the CLI

def study_json(out: Path) -> list[dict]:
    return json.loads((out / "study.json").read_text())


def test_a_one_point_study_trains_records_and_reports(tmp_path, capsys):
    """The command's smoke test: `scaletrain study` in this process, its point a real `scaletrain train` launch."""
    out = tmp_path / "study"
    assert main(["study", "--nproc", "1", "--workers", "0", *TINY, "--batch-size", "64", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    [entry] = study_json(out)
    assert CONTRACT_KEYS <= set(entry) and entry["id"] == "nproc1"
    assert entry["status"] == "completed" and entry["epoch_time_s"] > 0 and entry["speedup"] == 1.0
    run = json.loads((out / "points" / "nproc1" / "r0" / "summary.json").read_text())
    assert run["status"] == "completed" and run["model"] == "mlp" and run["world_size"] == 1
    assert "nproc = [1]" in (out / "study.toml").read_text() and (out / "points" / "nproc1" / "r0.log").is_file()
    # output that is not a terminal (a log): the study says each run started, the run's log has its steps
    assert "point 1/1  nproc=1 workers=0 " in printed and ": running, no step yet  (log: points/nproc1/r0.log)\n" \
        in printed
    assert "epoch 1/1  step 1/" in (out / "points" / "nproc1" / "r0.log").read_text()
    if HAS_REPORT:
        assert (out / "report.html").is_file() and f"report: {out / 'report.html'}" in printed
    assert f"study.json: {out / 'study.json'}" in printed


@pytest.mark.slow  # five study commands, three training launches: make test-slow
def test_study_end_to_end_resume_and_refusal(tmp_path):
    out = tmp_path / "study"
    argv = ["study", "--nproc", "1,2", "--workers", "0", *TINY, "--batch-size", "64", "--out", str(out)]
    proc = scaletrain(*argv)
    if HAS_REPORT:
        assert_ok(proc)
        assert (out / "report.html").is_file()
    entries = study_json(out)
    assert [e["id"] for e in entries] == ["nproc1", "nproc2"]
    for e in entries:
        assert CONTRACT_KEYS <= set(e)
        assert e["status"] == "completed" and e["repeats"] == 1 and e["epoch_time_s"] > 0
        assert e["runs"] == [f"points/{e['id']}/r0"]
        assert json.loads((out / e["runs"][0] / "summary.json").read_text())["status"] == "completed"
        assert (out / "points" / e["id"] / "r0.log").is_file()
    assert entries[0]["speedup"] == 1.0 and entries[0]["baseline"] == "nproc1"
    assert entries[1]["ideal_speedup"] == 2.0 and entries[1]["speedup"] > 0
    assert entries[1]["config"]["nproc"] == 2 and "out" not in entries[1]["config"]
    assert "nproc = [1, 2]" in (out / "study.toml").read_text()
    assert "nproc2" in proc.stdout and "speedup" in proc.stdout

    # the same command again: every run is done, nothing is launched
    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("points/*/r0/summary.json")}
    again = scaletrain(*argv)
    if HAS_REPORT:
        assert_ok(again)
    assert again.stdout.count("skipped") == 2
    assert {p: p.stat().st_mtime_ns for p in out.glob("points/*/r0/summary.json")} == mtimes

    # a different spec into the same directory: one line, exit 2, nothing touched
    other = scaletrain("study", "--nproc", "1,4", "--workers", "0", *TINY, "--out", str(out))
    assert other.returncode == 2
    lines = other.stderr.strip().splitlines()
    assert len(lines) == 1 and "different spec" in lines[0] and "nproc: [1, 2] there, [1, 4] here" in lines[0]
    assert {p: p.stat().st_mtime_ns for p in out.glob("points/*/r0/summary.json")} == mtimes

    # a half-finished run (its summary lost, its checkpoint left) is removed and run again
    (out / "points" / "nproc1" / "r0" / "summary.json").unlink()
    dry = scaletrain(*argv, "--dry-run")
    assert_ok(dry)
    assert "rerun (unfinished)" in dry.stdout and "1 done, 1 to run" in dry.stdout
    resumed = scaletrain(*argv)
    if HAS_REPORT:
        assert_ok(resumed)
    assert "nproc1: removing an unfinished earlier run" in resumed.stdout and "skipped nproc2" in resumed.stdout
    assert [e["status"] for e in study_json(out)] == ["completed", "completed"]


BROKEN_MODEL = """
import torch


class Broken(torch.nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.fc = torch.nn.Linear(1, num_classes)

    def forward(self, x):
        if not x.is_meta:  # builds, and passes the memory estimate on the meta device: only a run fails
            raise RuntimeError("broken forward pass")
        return self.fc(x.flatten(1)[:, :1])


def build(num_classes=10):
    return Broken(num_classes)
"""


@pytest.mark.slow  # two launches: make test-slow
def test_a_failing_point_is_recorded_and_the_others_complete(tmp_path):
    # every check before launching passes (the model builds); what fails is found by the run alone
    (tmp_path / "brokennet.py").write_text(BROKEN_MODEL)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    out = tmp_path / "study"
    argv = ["study", "--model", "mlp,brokennet:build", "--dataset", "digits", "--epochs", "1", "--out", str(out)]
    proc = scaletrain(*argv, env=env)
    assert proc.returncode == 1, proc.stderr
    entries = study_json(out)
    assert [e["status"] for e in entries] == ["completed", "failed"]
    bad = entries[1]["id"]
    assert bad.startswith("nproc1-model_brokennet_build") and "broken forward pass" in entries[1]["error"]
    assert entries[1]["epoch_time_s"] is None and entries[1]["speedup"] is None
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith(f"error: 1 of 2 points failed: {bad}") and "rerun" in err
    assert f"✗ {bad} failed" in proc.stdout
    dry = scaletrain(*argv, "--dry-run", env=env)
    assert_ok(dry)
    assert "rerun (failed)" in dry.stdout and "1 done, 1 to run" in dry.stdout


@pytest.mark.slow  # a launch interrupted: make test-slow
def test_ctrl_c_stops_the_run_writes_study_json_and_exits_130(tmp_path):
    out = tmp_path / "study"
    env = {k: v for k, v in os.environ.items() if k not in JOIN_VARS}
    # resnet20's epoch takes seconds, so the signal lands while the run is still going
    proc = subprocess.Popen([sys.executable, "-m", "scaletrain", "study", "--model", "resnet20", "--dataset",
                             "digits", "--epochs", "1", "--out", str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a test runner started in the background inherits SIGINT ignored; a user's
                            # study in a terminal does not
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    config = out / "points" / "nproc1" / "r0" / "config.toml"
    deadline = time.monotonic() + 60
    while not config.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)  # what the terminal's Ctrl-C sends to the study
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout + stderr
    assert stderr.strip().splitlines()[-1].endswith("rerun the same command to resume")
    assert [e["status"] for e in study_json(out)] == ["pending"]
    dry = scaletrain("study", "--model", "resnet20", "--dataset", "digits", "--epochs", "1", "--out", str(out),
                     "--dry-run")
    assert_ok(dry)
    assert "rerun (unfinished)" in dry.stdout
