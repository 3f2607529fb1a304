"""Resume semantics (docs/run-directory.md): the schedule re-planned, identity refused before anything is
written, config.toml holding the run's settings, stale temps removed, every resumable ending says how."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import torch

import multirank
from conftest import assert_ok, scaletrain
from scaletrain.distributed.launch import preflight as launch
from scaletrain.cli import build_parser, main
from scaletrain.train.cli import train_config
from scaletrain.config.sections import OptimConfig
from scaletrain.config import load_toml
from scaletrain.train.optim import LRSchedule, build_optimizer, build_scheduler, resume_optimizer


def fingerprint(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def lrs_after_resume(steps_done: int, epochs_before: int, epochs_after: int, spe: int, **kw) -> list[float]:
    """LR of each step after resuming a run planned for `epochs_before` with `epochs_after`."""
    model = torch.nn.Linear(4, 2)
    old = OptimConfig(epochs=epochs_before, **kw)
    opt = build_optimizer(old, model, 1)
    sched = build_scheduler(old, opt, spe, 1)
    for _ in range(steps_done):
        opt.step()
        sched.step()
    state = opt.state_dict()
    new = OptimConfig(epochs=epochs_after, **kw)
    opt2 = build_optimizer(new, model, 1)
    sched2 = build_scheduler(new, opt2, spe, 1)
    resume_optimizer(opt2, sched2, state, steps_done)
    out = []
    for _ in range(steps_done, epochs_after * spe):
        out.append(opt2.param_groups[0]["lr"])
        opt2.step()
        sched2.step()
    return out


@pytest.mark.parametrize("kw", [{}, {"warmup_epochs": 1.0, "scale_lr": True, "batch_size": 512},
                                {"schedule": "step"}])
def test_extending_a_finished_run_continues_the_longer_schedule_not_lr_zero(kw):
    spe = 11
    got = lrs_after_resume(2 * spe, 2, 3, spe, **kw)
    want = [0.1 * LRSchedule(OptimConfig(epochs=3, **kw), spe, 1)(s) *
            (512 / 256 if kw.get("scale_lr") else 1) for s in range(2 * spe, 3 * spe)]
    assert got == pytest.approx(want, rel=1e-12)
    assert min(got) > 0


def test_changed_optimizer_settings_take_effect_on_resume():
    model = torch.nn.Linear(4, 2)
    old = OptimConfig(momentum=0.9, weight_decay=5e-4)
    opt = build_optimizer(old, model, 1)
    sched = build_scheduler(old, opt, 10, 1)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    new = OptimConfig(momentum=0.5, weight_decay=0.0, lr=0.01)
    opt2 = build_optimizer(new, model, 1)
    sched2 = build_scheduler(new, opt2, 10, 1)
    resume_optimizer(opt2, sched2, opt.state_dict(), 1)
    assert [g["momentum"] for g in opt2.param_groups] == [0.5, 0.5]
    assert [g["weight_decay"] for g in opt2.param_groups] == [0.0, 0.0]
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.01 * LRSchedule(new, 10, 1)(1))
    assert opt2.state  # the momentum buffers came along


@pytest.fixture(scope="module")
def finished(tmp_path_factory, ranks) -> Path:
    """A finished run (its ranks in-process: tests/multirank.py) that the refusals below must leave alone."""
    out = tmp_path_factory.mktemp("resume") / "run"
    multirank.train(ranks, "--model", "mlp", "--epochs", "2", "--batch-size", "128", "--no-progress",
                    "--out", str(out))
    return out


def test_saved_config_holds_the_run_not_the_invocation(finished):
    saved = load_toml(finished / "config.toml")
    assert "resume" not in saved and "stop_after" not in saved
    # the documented rerun recipe works: a new run from the saved settings
    cfg = train_config(build_parser().parse_args(["train", "--config", str(finished / "config.toml"),
                                                  "--out", str(finished.parent / "again")]))
    assert not cfg.launch.resume and cfg.model.name == "mlp" and cfg.optim.epochs == 2
    launch.preflight(cfg)  # passes: nothing refuses it


def test_rerunning_from_the_saved_config_without_out_never_touches_the_finished_run(finished, capsys):
    before = fingerprint(finished)
    assert main(["train", "--config", str(finished / "config.toml")]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert fingerprint(finished) == before


@pytest.mark.parametrize("flag", [["--width", "2"], ["--model", "lenet5"], ["--image-size", "16"],
                                  ["--optimizer", "adamw"]])
def test_a_refused_resume_writes_nothing(finished, flag, capsys):
    before = fingerprint(finished)
    assert main(["train", "--resume", "--out", str(finished), *flag]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and flag[0] in err[0]
    assert fingerprint(finished) == before


def test_a_resume_on_another_number_of_processes_says_so(finished, capsys):
    cfg = train_config(build_parser().parse_args(["train", "--resume", "--out", str(finished), "--nproc", "2",
                                                  "--epochs", "3"]))
    launch.preflight(cfg)
    err = capsys.readouterr().err
    assert "trained with 1 processes (global batch 128)" in err and "uses 2 (global batch 256)" in err


def _third_epoch_follows_the_4_epoch_plan(run: Path) -> None:
    steps = [json.loads(line) for line in (run / "metrics-rank0.jsonl").read_text().splitlines()]
    spe = 1437 // 128
    third = [s for s in steps if s["epoch"] == 2]
    assert len(third) == spe
    plan = LRSchedule(OptimConfig(epochs=4), spe, 1)
    assert [s["lr"] for s in third] == pytest.approx([0.1 * plan(2 * spe + i) for i in range(spe)])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["epochs"] == 3 and summary["epochs_planned"] == 4


def test_resume_with_more_epochs_replans_the_schedule(finished, tmp_path, ranks):
    run = tmp_path / "run"
    subprocess.run(["cp", "-r", str(finished), str(run)], check=True)
    multirank.train(ranks, "--resume", "--out", str(run), "--epochs", "4", "--stop-after", "1")
    _third_epoch_follows_the_4_epoch_plan(run)
    assert [json.loads(line)["epoch"] for line in (run / "epochs.jsonl").read_text().splitlines()] == [0, 1, 2]


@pytest.mark.slow  # a launch: the schedule's part in-process above
def test_resume_with_more_epochs_replans_cleans_temps_and_says_how_to_continue(finished, tmp_path):
    run = tmp_path / "run"
    subprocess.run(["cp", "-r", str(finished), str(run)], check=True)
    stale = run / ".checkpoint.pt.abc123.tmp"  # what a kill during a checkpoint write leaves
    stale.write_bytes(b"half a checkpoint")
    proc = scaletrain("train", "--resume", "--out", str(run), "--epochs", "4", "--stop-after", "1", "--no-progress")
    assert_ok(proc)
    assert not stale.exists()
    assert f"scaletrain train --resume --out {run}" in proc.stderr
    _third_epoch_follows_the_4_epoch_plan(run)


def test_resume_on_a_read_only_run_directory_is_one_line(finished, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "--bind", str(finished), str(ro)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        assert main(["train", "--resume", "--out", str(ro), "--epochs", "3"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: cannot write in {ro} (Read-only file system)")
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)
