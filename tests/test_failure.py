"""A failure keeps its cause: the one line names the first cause, the traceback stays in the run directory."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

import multirank
from conftest import scaletrain
from scaletrain.distributed import failure
from scaletrain.distributed.launch.outcome import rank_namer


def name(rank: int) -> str:
    return f"parameter server 0 (rank {rank})" if rank == 2 else f"worker rank {rank}"


def outcome(records=(), exitcodes=None, hung=None) -> failure.Outcome:
    return failure.Outcome(list(records), exitcodes or {}, hung or {}, timeout_s=20)


def test_a_rank_killed_by_a_signal_is_the_cause_not_the_peers_that_lost_it():
    records = [{"rank": 0, "line": "RuntimeError: Connection closed by peer", "time": 1.0}]
    line, bad_input = failure.explain(outcome(records, {2: -9, 0: 1}), name)
    assert line.startswith("parameter server 0 (rank 2) was killed by SIGKILL")
    assert not bad_input


def test_a_rank_that_stopped_responding_is_named_with_the_timeout():
    records = [{"rank": 0, "line": "RuntimeError: Timed out waiting 20000ms for recv", "time": 1.0}]
    line, _ = failure.explain(outcome(records, {0: 1, 1: -9}, hung={1: 21.0}), name)
    assert line.startswith("worker rank 1 stopped responding (no sign of life for 21 s)")
    assert "worker rank 0 gave up waiting after --timeout 20 s" in line
    assert "killed" not in line  # the watchdog's own SIGKILL is not the cause


def test_a_peer_silent_on_another_host_is_told_as_a_host_or_link_down():
    """No rank of this node hung (a remote host's link went down): the waiting rank's timeout says so."""
    records = [{"rank": 0, "line": "RuntimeError: Timed out waiting 20000ms for recv operation to complete",
                "time": 1.0, "user_error": False}]
    line, bad_input = failure.explain(outcome(records, {0: 1}), name)
    assert line.startswith("worker rank 0 heard nothing from a peer for --timeout 20 s (RuntimeError: Timed out")
    assert "a host or its network link went down" in line and "scaletrain doctor" in line
    assert not bad_input


def test_the_first_rank_to_fail_is_reported_with_where_its_traceback_is():
    records = [{"rank": 1, "line": "ValueError: boom (at nets.py:3 in forward)", "time": 1.0,
                "traceback": "/r/errors/rank1.txt", "user_error": False},
               {"rank": 0, "line": "RuntimeError: Connection reset by peer", "time": 2.0}]
    line, bad_input = failure.explain(outcome(records, {0: 1, 1: 1}), name)
    assert line == "worker rank 1 failed: ValueError: boom (at nets.py:3 in forward) [traceback: /r/errors/rank1.txt]"
    assert not bad_input


def test_bad_input_found_in_a_worker_keeps_exit_code_2():
    records = [{"rank": 0, "line": "unreadable image x.jpg: replace it", "time": 1.0, "user_error": True}]
    assert failure.explain(outcome(records, {0: 2}), name) == ("worker rank 0 failed: unreadable image x.jpg: "
                                                               "replace it", True)


def test_one_line_names_type_message_and_the_innermost_frame_outside_torch(tmp_path, monkeypatch):
    (tmp_path / "badnet.py").write_text(textwrap.dedent("""
        import torch
        def forward(x):
            return torch.nn.functional.linear(x, torch.zeros(5, 20))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import badnet
    import torch
    with pytest.raises(RuntimeError) as info:
        badnet.forward(torch.zeros(4, 10))
    line = failure.one_line(info.value)
    assert line.startswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert line.endswith(f"(at {tmp_path / 'badnet.py'}:4 in forward)")
    assert "\n" not in line
    sys.modules.pop("badnet", None)


def test_gloo_source_locations_are_dropped_from_the_message():
    err = RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 20000ms")
    assert failure.one_line(err).startswith("RuntimeError: Timed out waiting 20000ms")


def test_record_error_writes_the_traceback_to_the_run_and_a_line_for_the_launcher(tmp_path):
    run, err = tmp_path / "run", tmp_path / "err"
    err.mkdir()
    try:
        raise KeyError("missing")
    except KeyError as e:
        failure.record_error(err, run, 3, e, user_error=False)
    record = json.loads((err / "rank3.json").read_text())
    assert record["line"].startswith("KeyError: 'missing' (at ")
    assert record["traceback"] == str(run / "errors" / "rank3.txt")
    assert "Traceback (most recent call last)" in (run / "errors" / "rank3.txt").read_text()


USER_MODEL = """
import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(20, 10)   # the digits give 32*32 = 1024 inputs: a shape error
    def forward(self, x):
        return self.fc(x.flatten(1))
def make(num_classes, in_channels, image_size):
    return Net()
"""


def _worker_main(rank, world, cfg_dict, err_dir, model_dir):
    """The elastic agent's entry point in this rank; returns its exit code."""
    from scaletrain.train.worker import worker_main

    sys.path.insert(0, model_dir)
    try:
        worker_main(cfg_dict, err_dir)
    except SystemExit as e:
        return e.code
    finally:
        sys.path.remove(model_dir)
        sys.modules.pop("shapebug", None)
    return 0


def test_a_user_model_that_raises_is_recorded_by_its_rank_as_one_line(tmp_path, ranks, monkeypatch):
    """worker_main records the failure as the launcher reads it (the launch itself: the test below, slow)."""
    (tmp_path / "shapebug.py").write_text(USER_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))  # the checks before a launch build the model too
    out, err = tmp_path / "run", tmp_path / "err"
    err.mkdir()
    try:
        cfg = multirank.prepare("--model", "shapebug:make", "--epochs", "1", "--out", str(out))
    finally:
        sys.modules.pop("shapebug", None)
    [code] = ranks.run(_worker_main, 1, cfg.to_dict(), str(err), str(tmp_path))
    (err / "alive-rank0").unlink()  # a failed rank beats until it exits: this one lives on in the pool
    assert code == 1
    line, bad_input = failure.explain(failure.read_outcome(err, {0: code}, cfg.faults.timeout), rank_namer(cfg))
    assert not bad_input
    assert line.startswith("rank 0 failed: RuntimeError: mat1 and mat2 shapes cannot be multiplied"), line
    assert "shapebug.py:8 in forward" in line
    assert line.endswith(f"[traceback: {out / 'errors' / 'rank0.txt'}]")
    assert "in forward" in (out / "errors" / "rank0.txt").read_text()


@pytest.mark.slow  # a launch: its rank's part in-process above
def test_a_user_model_that_raises_reports_type_message_and_its_own_line(tmp_path):
    (tmp_path / "shapebug.py").write_text(USER_MODEL)
    out = tmp_path / "run"
    proc = scaletrain("train", "--model", "shapebug:make", "--epochs", "1", "--no-progress", "--out", str(out),
                      env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    line = errors[0]
    assert "rank 0 failed: RuntimeError: mat1 and mat2 shapes cannot be multiplied" in line
    assert "shapebug.py:8 in forward" in line
    assert f"[traceback: {out / 'errors' / 'rank0.txt'}]" in line
    assert "in forward" in (out / "errors" / "rank0.txt").read_text()


@pytest.mark.slow
def test_a_stopped_rank_is_named_within_the_timeout(tmp_path):
    """SIGSTOP on rank 1 at its 3rd step: rank 0 waits --timeout 8 s, then the line names rank 1."""
    proc = scaletrain("train", "--model", "mlp", "--nproc", "2", "--epochs", "2", "--timeout", "8",
                      "--inject", "stop-rank=1:3", "--no-progress", "--out", str(tmp_path / "run"), timeout=90)
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: rank 1 stopped responding"), proc.stderr
    assert "rank 0 gave up waiting after --timeout 8 s" in lines[-1]
    assert not any(line.startswith(("[W", "[E", "W1", "E1", "frame #")) for line in lines), proc.stderr


@pytest.mark.slow
def test_a_node_whose_node_0_never_comes_says_so_within_the_timeout(tmp_path):
    import socket
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = scaletrain("train", "--model", "mlp", "--epochs", "1", "--nnodes", "2", "--node-rank", "1",
                      "--master-port", str(port), "--timeout", "5", "--no-progress", "--out", str(tmp_path / "r"),
                      timeout=90)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, proc.stderr  # the waiting note, then the error
    assert lines[0].startswith("node 1 of 2: waiting up to 5 s")
    assert lines[1].startswith(f"error: the nodes did not meet at 127.0.0.1:{port} within --timeout 5 s")


def test_a_rank_briefly_silent_is_not_blamed_for_the_failure_of_another():
    records = [{"rank": 0, "line": "unreadable image x.jpg: replace it", "time": 1.0, "user_error": True}]
    line, bad_input = failure.explain(outcome(records, {0: 2, 1: -9}, hung={1: 6.0}), name)
    assert line == "worker rank 0 failed: unreadable image x.jpg: replace it" and bad_input


def test_the_watchdog_ends_a_silent_rank_once_another_has_failed(tmp_path):
    import os
    import subprocess
    import time
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        alive = tmp_path / "alive-rank1"
        alive.write_text(str(sleeper.pid))
        os.utime(alive, (time.time() - 30, time.time() - 30))
        (tmp_path / "alive-rank0").write_text("1")  # rank 0 reported its failure: never touched
        os.utime(tmp_path / "alive-rank0", (time.time() - 30, time.time() - 30))
        (tmp_path / "rank0.json").write_text(json.dumps({"rank": 0, "line": "x", "time": 1.0}))
        dog = failure.Watchdog(tmp_path)
        assert sleeper.wait(timeout=10) == -9
        dog.stop()
        assert float((tmp_path / "hung-rank1").read_text()) >= 30
        assert not (tmp_path / "hung-rank0").exists()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()


def _launch(tmp_path, *args):
    import os
    import subprocess
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                           "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS")}
    env["TMPDIR"] = str(tmp_path)  # the launcher's heartbeat folder lands here, where the test can see it
    return subprocess.Popen([sys.executable, "-m", "scaletrain", "train", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(predicate, seconds: float) -> None:
    import time
    end = time.time() + seconds
    while not predicate():
        assert time.time() < end, "timed out"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_killed_parameter_server_is_named_as_the_server(tmp_path):
    import os
    import signal
    proc = _launch(tmp_path, "--strategy", "ps-sync", "--nproc", "3", "--model", "mlp", "--epochs", "20",
                   "--batch-size", "32", "--no-progress", "--out", str(tmp_path / "run"))
    try:
        _wait_for(lambda: list(tmp_path.glob("scaletrain-err-*/alive-rank2")) and
                  (tmp_path / "run" / "metrics-rank0.jsonl").exists(), 120)
        os.kill(int(next(tmp_path.glob("scaletrain-err-*/alive-rank2")).read_text()), signal.SIGKILL)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors == ["error: parameter server 0 (rank 2) was killed by SIGKILL (out of memory? see `dmesg`); "
                      "the other ranks ended with it"], err


@pytest.mark.slow
def test_sigterm_ends_with_143_and_the_resume_command(tmp_path):
    import signal
    run = tmp_path / "run"
    proc = _launch(tmp_path, "--model", "mlp", "--epochs", "50", "--batch-size", "16", "--no-progress",
                   "--out", str(run))
    try:
        _wait_for(lambda: (run / "checkpoint.pt").exists(), 120)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert f"scaletrain train --resume --out {run}" in err
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"
