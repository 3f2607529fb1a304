"""A worker killed with `kill -9` from outside, mid-epoch, ten times over: every time the elastic agent
restarts the workers, they resume from the latest checkpoint, and the run ends bit for bit where an
uninterrupted run does. Each launch runs under a wall-clock guard, so a failed recovery can never hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, assert_ok, scaletrain, summary
from scaletrain.distributed.env import child_env

pytestmark = pytest.mark.slow

BASE = ("--model", "lenet5", "--dataset", "digits", "--epochs", "2", "--batch-size", "16", "--nproc", "2",
        "--checkpoint-every", "8", "--no-progress")
GUARD_S = 240  # one launch, restart included, takes about 15 s here


def steps_recorded(run: Path) -> int:
    path = run / "metrics-rank0.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def beating_pid(rank: int, launcher: int) -> int | None:
    """The PID of rank `rank` of a launch that `launcher` started (its child, or its agent's): each rank
    beats a heartbeat file holding its PID (distributed/failure.py) in its launcher's error folder."""
    import tempfile

    for beat in Path(tempfile.gettempdir()).glob(f"scaletrain-err-*/alive-rank{rank}"):
        try:
            pid = int(beat.read_text())
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            grandparent = int(Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if launcher in (parent, grandparent):
            return pid
    return None


def kill_mid_run(cmd: list[str], run: Path, rank: int, at_step: int) -> subprocess.CompletedProcess:
    """Launch `cmd`, SIGKILL its rank `rank` once rank 0 has recorded `at_step` steps, wait for the end
    (guarded: past GUARD_S the launch and everything it started are killed and the test fails)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + GUARD_S
    killed = False
    try:
        while not killed and proc.poll() is None and time.monotonic() < deadline:
            if steps_recorded(run) >= at_step:
                pid = beating_pid(rank, proc.pid)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed = True
            time.sleep(0.005)
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the workers it started: ours
        out, err = proc.communicate()
        pytest.fail(f"no end within {GUARD_S} s after killing rank {rank} at step {at_step}:\n{err[-3000:]}")
    assert killed, f"the run ended before step {at_step}:\n{err[-2000:]}"
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_kill_9_of_a_worker_is_recovered_ten_times_out_of_ten(tmp_path):
    whole = tmp_path / "whole"
    assert_ok(scaletrain("train", *BASE, "--out", str(whole)))
    want = summary(whole)["param_digests"]
    outcomes = []
    for i in range(10):
        rank, at_step = i % 2, 5 + 9 * i  # both ranks; steps in both epochs (44 each), between checkpoints
        run = tmp_path / f"kill{i}"
        cmd = [sys.executable, "-m", "scaletrain", "train", *BASE, "--max-restarts", "2", "--out", str(run)]
        proc = kill_mid_run(cmd, run, rank, at_step)
        assert_ok(proc)
        s = summary(run)
        assert s["status"] == "completed" and s["steps"] == 88
        assert s["param_digests"] == want, f"repetition {i}: the weights differ from the uninterrupted run's"
        [r] = s["restarts"]
        assert r["rank"] == rank and "SIGKILL" in r["cause"]
        assert r["resumed_from_step"] % 8 == 0 and r["resumed_from_step"] <= r["reached_step"]
        assert 0 <= r["steps_replayed"] <= 8 + 1
        steps = [json.loads(line)["step"] for line in (run / "metrics-rank1.jsonl").read_text().splitlines()]
        assert steps == list(range(88))
        outcomes.append(r["recovery_s"])
    print(f"recovered 10 of 10; seconds from the kill to the first step trained again: "
          f"{', '.join(f'{t:.1f}' for t in outcomes)}")


@pytest.mark.parametrize("strategy", ["ps-sync", "ps-async"])
def test_a_dead_parameter_server_ends_the_job_with_one_line_naming_it(tmp_path, strategy):
    """Even ps-async, which goes on without a dead worker, cannot go on without a server's shard."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "scaletrain", "train", "--model", "lenet5", "--dataset", "digits", "--epochs", "3",
           "--batch-size", "16", "--nproc", "3", "--strategy", strategy, "--no-progress", "--out", str(run)]
    done = kill_mid_run(cmd, run, rank=2, at_step=20)  # rank 2: the server
    assert done.returncode == 1
    err = done.stderr
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "parameter server 0 (rank 2)" in errors[0], err
    assert "Traceback" not in err
    assert summary(run)["status"] == "failed"


@pytest.mark.parametrize("flags", [
    ("--strategy", "pipeline", "--stages", "2", "--microbatches", "4", "--batch-size", "32"),
    ("--strategy", "fsdp", "--batch-size", "16"),
    ("--strategy", "ring", "--batch-size", "16"),
], ids=["pipeline", "fsdp", "ring"])
def test_every_lockstep_strategy_launched_by_the_command_recovers_bitwise(tmp_path, flags):
    """The command and the elastic agent end to end for the other strategies: an uninterrupted run, and one
    whose rank 1 dies after step 15 and is restarted from the step-12 checkpoint, end with equal weights."""
    common = ("--model", "lenet5", "--dataset", "digits", "--epochs", "2", "--nproc", "2", "--no-progress", *flags)
    assert_ok(scaletrain("train", *common, "--out", str(tmp_path / "whole"), timeout=GUARD_S))
    proc = scaletrain("train", *common, "--checkpoint-every", "6", "--max-restarts", "1", "--inject", "kill-rank=1:15",
                      "--out", str(tmp_path / "killed"), timeout=GUARD_S)
    assert_ok(proc)
    whole, killed = summary(tmp_path / "whole"), summary(tmp_path / "killed")
    assert whole["status"] == killed["status"] == "completed"
    assert killed["param_digests"] == whole["param_digests"] and killed["top1"] == whole["top1"]
    [r] = killed["restarts"]
    assert (r["rank"], r["resumed_from_step"], r["reached_step"]) == (1, 12, 15)
