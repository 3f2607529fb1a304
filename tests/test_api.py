"""scaletrain.api: reading runs, studies and predictions as typed values; train, study and predict with the
commands' settings as keyword arguments (bad input raises UserError, nothing written); a launch at the top
level of a script, which every spawned worker runs again, named in one line."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import scaletrain.api as st
from conftest import summary
from predict_fixtures import fake_calibration
from scaletrain.distributed import failure
from scaletrain.distributed.env import JOIN_VARS
from scaletrain.distributed.launch import spawned
from scaletrain.errors import UserError

DATA = Path(__file__).parent / "data"
TINY = dict(model="lenet5", dataset="digits", epochs=1, batch_size=256, progress=False)
POINTS = {k: v for k, v in TINY.items() if k != "progress"}  # (a study sets progress per run itself)
GUARD = 'put the call under `if __name__ == "__main__":`'


def copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(DATA / name, tmp_path / name))


# ------------------------------------------------------------------ reading

def test_a_run_reads_as_typed_values_from_its_files(tmp_path):
    path = copy("run-a", tmp_path)
    s = json.loads((path / "summary.json").read_text())
    run = st.load_run(path)
    assert (run.path, run.status, run.model, run.world_size, run.global_batch) == (path, "completed", "resnet20", 2, 64)
    assert run.top1 == s["top1"] and run.samples_per_s == s["samples_per_s"] and run.summary == s
    assert run.config["optimizer"] == "nesterov" and run.epoch_time_s == 0.488
    lines = [json.loads(line) for line in (path / "epochs.jsonl").read_text().splitlines()]
    assert [(e.epoch, e.train_loss, e.top1) for e in run.epochs] == [(e["epoch"], e["train_loss"], e["top1"])
                                                                     for e in lines]
    # phases per rank, recomputed from the metrics files as the report does
    assert [r.rank for r in run.ranks] == [0, 1]
    for r, want in zip(run.ranks, s["ranks"], strict=True):
        assert r.phases_mean_s == pytest.approx(want["phases_mean_s"]) and r.peak_memory_bytes == want["peak_memory_bytes"]
    assert run.phases_mean_s == pytest.approx(s["phases_mean_s"])
    assert [f.kind for f in run.diagnosis] == ["compute-bound"] and run.diagnosis[0].lever
    with pytest.raises(AttributeError):  # frozen
        run.status = "failed"


def test_a_study_reads_as_its_points_in_grid_order(tmp_path):
    path = copy("study-a", tmp_path)
    points = json.loads((path / "study.json").read_text())
    study = st.load_study(path)
    assert study.axes == {"nproc": (1, 2, 4), "workers": (0, 2)} and study.repeats == 1
    assert study.train["model"] == "resnet20"
    assert [p.id for p in study.points] == [p["id"] for p in points]
    two = study.point(nproc=2, workers=0)
    assert (two.speedup, two.efficiency, two.status) == (points[2]["speedup"], points[2]["efficiency"], "completed")
    assert two.runs == (path / "points" / "nproc2-workers0" / "r0",) and two.diagnosis[0].kind == "input-bound"
    assert [p.id for p in study.failed] == ["nproc4-workers2"] and "out of memory" in study.failed[0].error
    with pytest.raises(UserError, match="2 points .* give one value of each axis"):
        study.point(nproc=2)


def test_the_package_offers_the_readers_without_importing_torch(tmp_path):
    path = copy("run-a", tmp_path)
    code = ("import sys, scaletrain; run = scaletrain.load_run(sys.argv[1]); "
            "print(run.status, 'torch' in sys.modules, scaletrain.api.train.__module__)")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["completed", "False", "scaletrain.api.launch"], proc.stderr


@pytest.mark.parametrize("read, what", [(st.load_run, "a study, not a run"), (st.load_study, "a run, not a study")])
def test_the_wrong_kind_of_directory_is_a_user_error(tmp_path, read, what):
    other = copy("study-a" if read is st.load_run else "run-a", tmp_path)
    with pytest.raises(UserError, match=what):
        read(other)
    with pytest.raises(UserError, match="does not exist"):
        read(tmp_path / "nowhere")


# ------------------------------------------------------------------ bad input: raised, nothing written

@pytest.mark.parametrize("settings, words", [
    (dict(batchsize=64), "unknown key 'batchsize' in scaletrain.api.train(): did you mean 'batch_size'?"),
    (dict(lerning_rate=0.1), "did you mean 'lr'?"),
    (dict(lr="fast"), "'lr' must be a float, got 'fast'"),
    (dict(epochs=0), "--epochs"),
    (dict(model="resnt20", dataset="synthetic", synthetic_samples=64), "unknown model 'resnt20'"),
])
def test_bad_train_settings_raise_before_anything_is_written(tmp_path, settings, words):
    out = tmp_path / "run"
    with pytest.raises(UserError) as e:
        st.train(**{**TINY, **settings, "out": out})
    assert words in str(e.value)
    assert not out.exists()


@pytest.mark.parametrize("settings, words", [
    (dict(nproc=[1, "two"]), "nproc takes integers"),
    (dict(workers=[0, 0]), "lists 0 twice"),
    (dict(lr=[0.1, 0.2]), "lr is not an axis"),
    (dict(resume=True), "'resume' in scaletrain.api.study() is set by the study for each run"),
    (dict(nproc=[1, 2], warmup_epochs=2), "study point nproc1 (nproc=1, batch_size=256, dataset=digits, model=lenet5): --warmup-epochs"),
])
def test_bad_study_settings_raise_before_anything_is_written(tmp_path, settings, words):
    out = tmp_path / "study"
    with pytest.raises(UserError) as e:
        st.study(out, **{**POINTS, **settings})
    assert words in str(e.value)
    assert not out.exists()


# ------------------------------------------------------------------ launching

def test_a_tiny_train_returns_its_run(tmp_path):
    out = tmp_path / "run"
    run = st.train(**TINY, out=out)
    assert (run.status, run.model, run.world_size, run.path) == ("completed", "lenet5", 1, out)
    assert len(run.epochs) == 1 and run.epochs[0].top1 == run.top1 == summary(out)["top1"]
    assert [r.rank for r in run.ranks] == [0] and set(run.ranks[0].phases_mean_s) >= {"forward", "backward"}
    assert run.config["batch_size"] == 256 and run == st.load_run(out)  # what the directory says, read back


@pytest.mark.slow  # a second launch: make test-slow
def test_a_run_that_fails_raises_the_launchers_line_with_its_directory(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(st.RunFailed) as e:
        st.train(**TINY, inject="kill-rank=0:1", out=out)
    assert "rank 0 was killed by SIGKILL" in str(e.value) and e.value.path == out
    assert summary(out)["status"] == "failed" and summary(out)["error"] == str(e.value)


@pytest.mark.slow  # a real prediction (15 s here); predict's own smoke tests are fast
def test_predict_takes_lists_as_axes_and_returns_the_prediction(tmp_path):
    from scaletrain.predict import calibration

    cal = calibration.save(fake_calibration(), tmp_path / "cal.json")
    out = tmp_path / "pred"
    pred = st.predict(out, calibration=cal, link="10gbit", model="lenet5", dataset="synthetic", synthetic_samples=512,
                      image_size=32, batch_size=32, nproc=[1, 2], nnodes=[1, 2])
    data = json.loads((out / "prediction.json").read_text())
    assert pred.data == data and pred.path == out / "prediction.json"
    assert [(p.axes["nproc"], p.axes["nnodes"]) for p in pred.points] == [(n, k) for k in (1, 2) for n in (1, 2)]
    assert [p.step_time_s for p in pred.points] == [p["step_time_s"] for p in data["points"]]
    assert pred.points[0].speedup == 1.0 and pred.points[0].limit and pred == st.load_prediction(out)
    with pytest.raises(UserError, match="nnodes 0"):
        st.predict(tmp_path / "bad", calibration=cal, model="lenet5", nnodes=[0, 1])


# ------------------------------------------------------------------ a launch at a script's top level

def test_in_a_spawned_worker_importing_the_script_a_launch_is_refused(tmp_path, monkeypatch):
    spawned.refuse_in_spawned_import("scaletrain.api.train()")  # an ordinary process: nothing happens
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    monkeypatch.delenv(spawned.LAUNCH_ERRORS, raising=False)
    with pytest.raises(UserError, match=GUARD):  # no launcher to tell: raised
        st.train(**TINY, out=tmp_path / "run")
    # under a launcher: one record for it, and the worker ends with the bad-input code
    with spawned.errors_to(str(tmp_path)), pytest.raises(SystemExit) as e:
        st.study(tmp_path / "study", nproc=[1, 2])
    assert e.value.code == 2 and spawned.LAUNCH_ERRORS not in os.environ
    line, bad_input = failure.explain(failure.read_outcome(tmp_path, {0: 2}, 180.0), lambda r: f"rank {r}")
    assert bad_input and line.startswith("rank 0 failed: scaletrain.api.study() ran again in a worker")
    assert line.endswith(GUARD) and not (tmp_path / "run").exists() and not (tmp_path / "study").exists()


SCRIPT = """\
import scaletrain.api as st
import scaletrain.cli
print("top level")
{call}
print("after the launch")
"""
CALLS = {"api": 'st.train(model="mlp", dataset="synthetic", synthetic_samples=64, image_size=8, epochs=1, '
                'progress=False, out="run")',
         "cli": 'scaletrain.cli.main(["train", "--model", "mlp", "--dataset", "synthetic", "--synthetic-samples", '
                '"64", "--image-size", "8", "--epochs", "1", "--no-progress", "--out", "run"])'}


# a second end-to-end launch through the API (a script run with python): make test-slow; the API's launch is
# smoke-tested by test_a_tiny_train_returns_its_run, the refusal in a spawned worker in-process above
@pytest.mark.slow
@pytest.mark.parametrize("how", ["api", "cli"])
def test_a_launch_at_the_top_level_of_a_script_says_to_add_the_guard(tmp_path, how):
    script = tmp_path / "experiment.py"
    script.write_text(SCRIPT.format(call=CALLS[how]))
    env = {k: v for k, v in os.environ.items() if k not in JOIN_VARS}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    message = (f"rank 0 failed: {'scaletrain.api.train()' if how == 'api' else 'scaletrain.cli.main()'} ran "
               f"again in a worker process, which re-runs the top level of {script}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith(("error:", "scaletrain.errors.UserError"))]
    assert errors and all(message in line and line.endswith(GUARD) for line in errors), proc.stderr
    assert "Traceback" not in proc.stderr.split(errors[0])[0]  # no worker's multiprocessing traceback before it
    assert proc.stdout.count("top level") == 2  # this process, and the one worker that ran it again
    if how == "api":  # raised in the script
        assert proc.returncode == 1 and "after the launch" not in proc.stdout
    else:  # the command's exit code, returned
        assert proc.returncode == 0 and "after the launch" in proc.stdout
    assert summary(tmp_path / "run")["error"].startswith(message)


@pytest.mark.slow  # a 2-process run, a 2-point study and a prediction: make test-slow
def test_the_example_script_runs(tmp_path):
    from conftest import ROOT
    from scaletrain.predict import calibration

    cal = calibration.save(fake_calibration(), tmp_path / "cal.json")
    env = {k: v for k, v in os.environ.items() if k not in JOIN_VARS}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "api_example.py"), "--out", str(tmp_path / "ex"),
                           "--calibration", str(cal)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert "lenet5 on 2 processes: top-1" in proc.stdout and "rank 1: data_wait" in proc.stdout
    assert "nproc2: completed" in proc.stdout and "predicted nproc8" in proc.stdout
    assert st.load_study(tmp_path / "ex" / "study").failed == ()
