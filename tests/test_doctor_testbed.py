"""`scaletrain doctor` on three testbed hosts (root only): all pass; then one fault at a time on host 2, each
caught by its own check and by no other: a link 100x slower, the rendezvous port blocked, every port but
the rendezvous blocked (the collectives'), a torch version faked through the environment."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import assert_ok, scaletrain
from scaletrain.testbed import plan
from scaletrain.testbed.plan import shape
from scaletrain.testbed.run import host_command, host_env

pytestmark = [pytest.mark.slow,  # network namespaces, three doctor runs per test: make test-slow
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
                                 reason="the testbed needs root and iproute2")]

RATE = "1gbit"
TB = plan.Testbed(3, RATE, "0ms")
GUARD_S = 150  # wall-clock guard of one doctor run on all hosts


def _ours():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("st-")]


@pytest.fixture(scope="module")
def testbed(tmp_path_factory):
    """Three hosts on 1 Gbit links for the whole module, removed at the end (also after a failure)."""
    if _ours():
        pytest.skip("a testbed is already up on this machine; not touching it")
    env = {"SCALETRAIN_TESTBED_STATE": str(tmp_path_factory.mktemp("testbed") / "testbed.json")}
    up = scaletrain("testbed", "up", "--hosts", "3", "--rate", RATE, env=env, timeout=60)
    if up.returncode != 0:
        scaletrain("testbed", "down", env=env, timeout=60)
        pytest.skip(f"network namespaces cannot be made here: {up.stderr.strip()[-200:]}")
    try:
        yield env
    finally:
        scaletrain("testbed", "down", env=env, timeout=60)
        assert _ours() == []


def _doctor_argv(tmp_path) -> list[str]:
    return [sys.executable, "-m", "scaletrain", "doctor", "--link-rate", RATE, "--timeout", "8",
            "--out", str(tmp_path / "run"), "--json", str(tmp_path / "doctor.json")]


def run_hosts(tmp_path, port: int, extra_env: dict[int, dict] | None = None) -> tuple[list, dict]:
    """doctor on every host as `testbed run` starts it (its argv and environment), with per-host extra
    environment; returns ([(exit code, stdout, stderr)] per host, node 0's JSON)."""
    procs = [subprocess.Popen(host_command(TB, i, _doctor_argv(tmp_path), port),
                              env={**host_env(TB, i), **(extra_env or {}).get(i, {})}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
             for i in range(TB.hosts)]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=GUARD_S)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:  # the guard: whatever still runs (only what this test started) is killed
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    doc_path = tmp_path / "doctor.json"
    assert doc_path.is_file(), results
    return results, json.loads(doc_path.read_text())


def failing(doc: dict) -> dict[str, list[dict]]:
    rows = {}
    for c in doc["checks"]:
        if c["status"] == "fail":
            rows.setdefault(c["check"], []).append(c)
    return rows


def _port() -> int:
    return random.randint(20000, 59000)


def test_three_hosts_pass_through_testbed_run(testbed, tmp_path):
    proc = scaletrain("testbed", "run", "--", sys.executable, "-m", "scaletrain", "doctor", "--link-rate", RATE,
                      "--out", str(tmp_path / "run"), "--json", str(tmp_path / "doctor.json"), env=testbed,
                      timeout=GUARD_S)
    assert_ok(proc)
    doc = json.loads((tmp_path / "doctor.json").read_text())
    assert doc["status"] == "pass" and doc["exit_code"] == 0
    assert [c["status"] for c in doc["checks"]] == ["pass"] * 10
    g = doc["gathered"]
    # testbed run gave every host its node flags: three members at host 0's address, each on its own address
    assert g["nnodes"] == 3 and g["members"] == [0, 1, 2] and g["master_addr"] == TB.address(0)
    assert [g["facts"][str(i)]["address"] for i in range(3)] == [TB.address(i) for i in range(3)]
    assert {f["comm_iface"] for f in g["facts"].values()} == {"eth0"}
    assert sorted((p["a"], p["b"]) for p in g["pairs"]) == [(0, 1), (0, 2), (1, 2)]
    assert all(p["status"] == "ok" and p["bytes_per_s"] > 0 for p in g["pairs"])
    assert sorted(g["rundir"]["0"]["sees"]) == [0, 1, 2]
    assert "scaletrain doctor: 3 nodes" in proc.stdout and proc.stdout.count("pass: 10 checks") == 3
    assert not (tmp_path / "run").exists()  # doctor created --out for its files and removed both


def test_a_link_100x_slower_fails_the_link_check_naming_that_host(testbed, tmp_path):
    slow = shape("10mbit", "0ms")
    subprocess.run(["tc", "-n", TB.host(2), "qdisc", "change", "dev", "eth0", "root", *slow], check=True)
    subprocess.run(["tc", "-n", "st-sw", "qdisc", "change", "dev", TB.port(2), "root", *slow], check=True)
    try:
        results, doc = run_hosts(tmp_path, _port())
    finally:
        for ns, dev in ((TB.host(2), "eth0"), ("st-sw", TB.port(2))):
            subprocess.run(["tc", "-n", ns, "qdisc", "change", "dev", dev, "root", *shape(RATE, "0ms")], check=True)
    assert [code for code, _, _ in results] == [1, 1, 1]
    bad = failing(doc)
    assert list(bad) == ["link"]
    assert [row["hosts"] for row in bad["link"]] == [f"node 2 ({TB.address(2)})"]
    pairs = {(p["a"], p["b"]): p for p in doc["gathered"]["pairs"]}
    rate = 1e9 / 8
    assert pairs[(0, 2)]["bytes_per_s"] < 0.3 * rate and pairs[(1, 2)]["bytes_per_s"] < 0.3 * rate
    assert pairs[(0, 1)]["status"] == "ok" and pairs[(0, 1)]["bytes_per_s"] >= 0.3 * rate
    assert "check node 2's link" in bad["link"][0]["fix"]


def test_a_blocked_rendezvous_port_fails_that_check_naming_the_host(testbed, tmp_path):
    port = _port()
    rule = ["ip", "-n", TB.host(2), "rule", "add", "ipproto", "tcp", "dport", str(port), "prohibit"]
    subprocess.run(rule, check=True)  # host 2's packets to node 0's rendezvous port go nowhere
    try:
        results, doc = run_hosts(tmp_path, port)
    finally:
        subprocess.run(["ip", "-n", TB.host(2), "rule", "del", *rule[5:]], check=True)
    assert [code for code, _, _ in results] == [1, 1, 1]
    bad = failing(doc)
    assert list(bad) == ["rendezvous port"]
    row = bad["rendezvous port"][0]
    assert row["hosts"] == f"node 2 ({TB.address(2)})" and f"not the rendezvous port {TB.address(0)}:{port}" in row["value"]
    assert f"open TCP port {port}" in row["fix"]
    g = doc["gathered"]
    assert g["members"] == [0, 1] and g["probed"] == [2]
    assert "reached node 0's probe port" in results[2][2]


def test_blocked_collective_ports_fail_the_link_check_naming_the_host(testbed, tmp_path):
    port = _port()
    # host 2 keeps the rendezvous and probe ports, but nothing else over TCP (gloo's ports are random)
    rules = [["ipproto", "tcp", "dport", str(port), "pref", "100", "lookup", "main"],
             ["ipproto", "tcp", "dport", str(port + 1), "pref", "101", "lookup", "main"],
             ["ipproto", "tcp", "pref", "102", "prohibit"]]
    for rule in rules:
        subprocess.run(["ip", "-n", TB.host(2), "rule", "add", *rule], check=True)
    try:
        results, doc = run_hosts(tmp_path, port)
    finally:
        for rule in rules:
            subprocess.run(["ip", "-n", TB.host(2), "rule", "del", *rule], check=True)
    assert [code for code, _, _ in results] == [1, 1, 1]
    bad = failing(doc)
    assert list(bad) == ["link"]
    assert [row["hosts"] for row in bad["link"]] == [f"node 2 ({TB.address(2)})"]
    assert "could not connect" in bad["link"][0]["value"] and "allow all TCP" in bad["link"][0]["fix"]
    pairs = {(p["a"], p["b"]): p["status"] for p in doc["gathered"]["pairs"]}
    assert pairs == {(0, 1): "ok", (0, 2): "no-connection", (1, 2): "no-connection"}


def test_a_version_mismatch_faked_on_one_host_fails_the_versions_check(testbed, tmp_path):
    results, doc = run_hosts(tmp_path, _port(), {2: {"SCALETRAIN_FAKE_VERSION": "torch=2.0.0"}})
    assert [code for code, _, _ in results] == [1, 1, 1]
    bad = failing(doc)
    assert list(bad) == ["versions"]
    row = bad["versions"][0]
    assert row["hosts"] == f"node 2 ({TB.address(2)})"
    assert row["value"].startswith("torch 2.0.0 on node 2") and "faked by SCALETRAIN_FAKE_VERSION" in row["value"]
    assert "install the same torch on every node" in row["fix"]
