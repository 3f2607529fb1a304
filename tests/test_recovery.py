"""Surviving interruptions (docs/recovery.md): checkpoints within an epoch, preemption requests, restarts by
the elastic agent, and their record; a resumed run ends where an uninterrupted one does, bit for bit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import multirank
from conftest import assert_ok, scaletrain, summary
from scaletrain.cli import main
from scaletrain.config.specs import without_failures
from scaletrain.rundir import RunDir
from scaletrain.train import checkpoint, restarts
from scaletrain.train.sampler import ResumableSampler

BASE = ("--model", "lenet5", "--dataset", "digits", "--epochs", "2", "--batch-size", "16")


# ------------------------------------------------------------------ pieces
def test_the_sampler_enters_an_epoch_part_way_in_the_same_order():
    data = list(range(103))
    full = ResumableSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
    part = ResumableSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
    full.set_epoch(4)
    part.set_epoch(4)
    part.skip = 20
    assert list(part) == list(full)[20:]
    assert len(part) == len(full) - 20
    part.skip = 0
    assert list(part) == list(full)


def test_a_restarted_worker_is_not_made_to_fail_again():
    assert without_failures("data=0.01,kill-rank=1:25,slow-rank=0:0.1,stop-rank=1:3") == "data=0.01,slow-rank=0:0.1"
    assert without_failures("kill-rank=1:25") is None
    assert without_failures(None) is None


def test_restart_records_pair_each_failure_with_the_attempt_that_came_back():
    lines = [{"event": "failure", "attempt": 0, "time": 100.0, "node": 0, "rank": 1, "cause": "rank 1 was killed",
              "reached_step": 25},
             {"event": "resumed", "attempt": 1, "time": 104.5, "step": 20},
             {"event": "failure", "attempt": 1, "time": 200.0, "node": 0, "rank": 0, "cause": "boom",
              "reached_step": 61}]
    got = restarts.restarts(lines)
    assert [(r["rank"], r["reached_step"], r["resumed_from_step"], r["steps_replayed"], r["recovery_s"])
            for r in got] == [(1, 25, 20, 5, 4.5), (0, 61, None, None, None)]


def test_reached_step_reads_the_last_whole_line_of_every_rank(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "metrics-rank0.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n')
    (tmp_path / "metrics-rank1.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n{"step": 3}\n{"st')
    assert restarts.reached_step(run) == 4
    assert restarts.reached_step(RunDir(tmp_path / "none")) is None


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one_loadable(tmp_path):
    """The writer is SIGKILLed while torch.save is part way through a 200 MB checkpoint."""
    path = tmp_path / "checkpoint.pt"
    checkpoint.save_atomic({"format": checkpoint.FORMAT, "epoch": 1}, path)
    code = ("import sys, torch\nfrom pathlib import Path\nfrom scaletrain.train import checkpoint\n"
            "print('writing', flush=True)\n"
            "checkpoint.save_atomic({'format': 1, 'epoch': 2, 'w': torch.ones(50_000_000)}, Path(sys.argv[1]))\n")
    writer = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "writing"
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("*.tmp*")) and not list(tmp_path.glob(".*")) and time.monotonic() < deadline:
            time.sleep(0.01)
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.wait(timeout=60)
    assert writer.returncode == -signal.SIGKILL
    assert checkpoint.load(path)["epoch"] == 1


# ------------------------------------------------------------------ in-process ranks
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, ranks) -> dict:
    out = tmp_path_factory.mktemp("recovery") / "whole"
    return multirank.train(ranks, *BASE, "--nproc", "2", "--out", str(out))


def _touch_when(run: Path, steps: int, stop: threading.Event) -> None:
    """Ask for preemption once rank 0 has recorded `steps` steps (the exact step is the machine's)."""
    metrics = run / "metrics-rank0.jsonl"
    while not stop.is_set():
        if metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
            (run / "preempt").touch()
            return
        time.sleep(0.002)


# in the first epoch (44 steps), at any step, in the second; the same resume from other steps is make test-slow
@pytest.mark.parametrize("after", [pytest.param(1, marks=pytest.mark.slow), 30,
                                   pytest.param(50, marks=pytest.mark.slow)])
def test_a_preempted_run_resumed_ends_bitwise_where_an_uninterrupted_one_does(uninterrupted, ranks, tmp_path, after):
    out = tmp_path / "run"
    argv = (*BASE, "--nproc", "2", "--out", str(out))
    cfg = multirank.prepare(*argv)
    stop = threading.Event()
    asker = threading.Thread(target=_touch_when, args=(out, after, stop), daemon=True)
    asker.start()
    try:
        first = ranks.run(multirank.train_rank, 2, cfg.to_dict(), timeout=120)[0]
    finally:
        stop.set()
        asker.join()
    assert first["status"] == "preempted"
    stopped_at = first["steps"]
    assert after <= stopped_at < 88
    ckpt = checkpoint.load(out / "checkpoint.pt")
    assert ckpt["global_step"] == stopped_at
    (out / "preempt").unlink()  # (scaletrain train removes the answered request when it starts)
    done = multirank.train(ranks, *argv, "--resume")
    assert done["status"] == "completed" and done["steps"] == 88
    assert done["param_digests"] == uninterrupted["param_digests"]
    assert done["top1"] == uninterrupted["top1"]
    steps = [json.loads(line)["step"] for line in (out / "metrics-rank1.jsonl").read_text().splitlines()]
    assert steps == list(range(88))  # every step once: the replayed ones replaced, none missing
    assert len((out / "epochs.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow  # a preempted run resumed mid-epoch (below) checks the same checkpoints in the default suite
def test_checkpoints_within_epochs_change_nothing_and_carry_the_place(uninterrupted, ranks, tmp_path):
    out = tmp_path / "every"
    every = multirank.train(ranks, *BASE, "--nproc", "2", "--checkpoint-every", "7", "--epochs", "1", "--out", str(out))
    whole = multirank.train(ranks, *BASE, "--nproc", "2", "--epochs", "1", "--out", str(tmp_path / "plain"))
    assert every["param_digests"] == whole["param_digests"]
    assert checkpoint.load(out / "checkpoint.pt")["within_epoch"] is None  # the epoch's end came last


def test_a_mid_epoch_checkpoint_refuses_another_number_of_processes(ranks, tmp_path, capsys):
    out = tmp_path / "run"
    argv = (*BASE, "--nproc", "2", "--out", str(out))
    cfg = multirank.prepare(*argv)
    (out / "preempt").touch()
    assert ranks.run(multirank.train_rank, 2, cfg.to_dict(), timeout=120)[0]["status"] == "preempted"
    (out / "preempt").unlink()
    before = (out / "checkpoint.pt").read_bytes()
    assert main(["train", "--resume", "--out", str(out), "--nproc", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "part way through epoch 1 by 2 processes" in err and "--nproc 2" in err
    assert (out / "checkpoint.pt").read_bytes() == before


# ------------------------------------------------------------------ the command
@pytest.mark.parametrize("flags, words", [
    (["--max-restarts", "-1"], "--max-restarts must be 0"),
    (["--checkpoint-every", "-5"], "--checkpoint-every must be 0"),
    (["--checkpoint-every", "10", "--strategy", "ps-async", "--nproc", "3"], "drop --checkpoint-every"),
    (["--max-restarts", "2", "--strategy", "ps-async", "--nproc", "3"], "drop --max-restarts"),
])
def test_impossible_recovery_settings_are_one_line(tmp_path, flags, words, capsys):
    assert main(["train", *BASE, *flags, "--out", str(tmp_path / "x")]) == 2  # (the command's path, in-process)
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.slow  # a launch with a restart (the pieces are tested in-process above)
def test_a_killed_worker_is_restarted_and_the_run_ends_as_if_never_killed(uninterrupted, tmp_path):
    """The command end to end: rank 1 SIGKILLs itself after step 25, the agent restarts both workers, they
    resume from the step-20 checkpoint; the summary says so."""
    out = tmp_path / "run"
    proc = scaletrain("train", *BASE, "--nproc", "2", "--checkpoint-every", "10", "--max-restarts", "1",
                      "--inject", "kill-rank=1:25", "--no-progress", "--out", str(out), timeout=300)
    assert_ok(proc)
    assert "restarting the workers (1 of --max-restarts 1) after: rank 1 was killed by SIGKILL" in proc.stderr
    s = summary(out)
    assert s["status"] == "completed" and s["steps"] == 88
    assert s["param_digests"] == uninterrupted["param_digests"]
    [r] = s["restarts"]
    assert (r["rank"], r["resumed_from_step"], r["reached_step"], r["steps_replayed"]) == (1, 20, 25, 5)
    assert 0 < r["recovery_s"] < 120
