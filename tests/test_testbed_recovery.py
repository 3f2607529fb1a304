"""Failures across hosts (root only: testbed hosts as network namespaces): a worker killed on host 1 is
restarted on both hosts and the run ends as if never killed; a host whose link goes down mid-run (its
switch port brought down, as a pulled cable) is noticed within --timeout with one clear line, never a hang."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, assert_ok, scaletrain, summary
from scaletrain.distributed.env import child_env

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
                                 reason="the testbed needs root and iproute2")]

TIMEOUT_S = 20


def _ours():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("st-")]


@pytest.fixture
def testbed(tmp_path):
    if _ours():
        pytest.skip("a testbed is already up on this machine; not touching it")
    env = {"SCALETRAIN_TESTBED_STATE": str(tmp_path / "testbed.json")}
    assert_ok(scaletrain("testbed", "up", "--hosts", "2", "--rate", "1gbit", env=env))
    yield env
    scaletrain("testbed", "down", env=env)  # also when the test failed
    assert _ours() == []


def test_a_host_whose_link_goes_down_is_noticed_within_the_timeout(testbed, tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "scaletrain", "testbed", "run", "--", sys.executable, "-m", "scaletrain", "train",
           "--nproc", "1", "--model", "lenet5", "--dataset", "digits", "--epochs", "50", "--batch-size", "16",
           "--timeout", str(TIMEOUT_S), "--no-progress", "--out", str(run)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**child_env(), **testbed}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    metrics = run / "metrics-rank0.jsonl"
    guard = time.monotonic() + 240
    try:
        while proc.poll() is None and time.monotonic() < guard:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 20:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"the run ended early:\n{proc.stderr.read()[-2000:]}"
        subprocess.run(["ip", "-n", "st-sw", "link", "set", "st-p1", "down"], check=True)  # host 1's cable
        down_at = time.monotonic()
        _, err = proc.communicate(timeout=TIMEOUT_S + 90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the testbed run and everything it started: ours
        proc.communicate()
        pytest.fail(f"still running {TIMEOUT_S + 90} s after host 1's link went down")
    noticed = time.monotonic() - down_at
    assert proc.returncode != 0
    assert noticed < TIMEOUT_S + 60
    errors = [line for line in err.splitlines() if "error:" in line]
    assert errors and any(f"heard nothing from a peer for --timeout {TIMEOUT_S} s" in line for line in errors), err
    assert "Traceback" not in err
    print(f"link down noticed after {noticed:.1f} s (--timeout {TIMEOUT_S})")


def test_a_worker_killed_on_one_host_is_restarted_on_both_and_ends_bitwise(testbed, tmp_path):
    common = ("--nproc", "1", "--model", "lenet5", "--dataset", "digits", "--epochs", "2", "--batch-size", "16",
              "--timeout", "30", "--no-progress")
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert_ok(scaletrain("testbed", "run", "--", sys.executable, "-m", "scaletrain", "train", *common,
                         "--out", str(whole), env=testbed, timeout=240))
    assert_ok(scaletrain("testbed", "run", "--", sys.executable, "-m", "scaletrain", "train", *common,
                         "--checkpoint-every", "6", "--max-restarts", "1", "--inject", "kill-rank=1:15",
                         "--out", str(killed), env=testbed, timeout=240))
    s = summary(killed)
    assert s["status"] == "completed" and s["param_digests"] == summary(whole)["param_digests"]
    nodes = {r["node"]: r for r in s["restarts"]}  # each node's agent restarted its worker once
    assert set(nodes) == {0, 1} and "rank 1 was killed by SIGKILL" in nodes[1]["cause"]
    assert all(r["resumed_from_step"] == 12 for r in s["restarts"])
