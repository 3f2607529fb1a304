"""scaletrain doctor: each check passes and fails on facts built by hand (no network), its fix line; the pair
schedule; bad input; and two real runs on loopback: two nodes that pass, and a node that never comes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from conftest import ROOT
from scaletrain.cli import main
from scaletrain.distributed.hostfacts import HostFacts, Interface, fake_versions
from scaletrain.distributed.launch.preflight import free_port
from scaletrain.doctor import checks, links
from scaletrain.doctor.gathered import Expect, Gathered
from scaletrain.doctor.table import document, node_line, summary_line, verdict
from scaletrain.errors import UserError
from scaletrain.units import parse_rate

GBIT = 1e9 / 8
EXPECT = Expect(link_rate="1gbit", link_bytes_per_s=GBIT)


def facts(rank: int, **changes) -> HostFacts:
    address = f"10.0.0.{rank + 1}"
    base = HostFacts(rank=rank, nnodes=3, hostname=f"host{rank}", address=address, route_iface="eth0",
                     comm_iface="eth0", comm_address=address, comm_source="GLOO_SOCKET_IFNAME", nccl_iface=None,
                     interfaces=[Interface("lo", "127.0.0.1", True, None), Interface("eth0", address, True, 1000)],
                     python="3.11.7", torch="2.13.0+cpu", scaletrain="0.1.0", gpus=0, nccl=None,
                     cuda_visible_devices=None)
    return replace(base, **changes)


def pair(a: int, b: int, bytes_per_s: float = 0.9 * GBIT, status: str = "ok") -> dict:
    return {"a": a, "b": b, "bytes": links.MESSAGE_BYTES, "seconds": [0.02], "status": status, "error": None,
            "bytes_per_s": bytes_per_s if status == "ok" else None}


def healthy(n: int = 3) -> Gathered:
    members = list(range(n))
    return Gathered(nnodes=n, master_addr="10.0.0.1", master_port=29500, timeout_s=20, probe_port=29501,
                    facts={r: facts(r, nnodes=n) for r in members}, members=members,
                    clock={r: {"offset_s": 0.001 * r, "rtt_s": 0.002} for r in members},
                    rundir={r: {"path": "runs", "wrote": True, "error": None, "sees": members, "free_bytes": 50e9}
                            for r in members},
                    pairs=[pair(a, b) for rnd in links.pair_rounds(members) for a, b in rnd])


def rows(g: Gathered, expect: Expect = EXPECT, name: str | None = None):
    out = checks.evaluate(g, expect)
    return [r for r in out if r.check == name] if name else out


def only_failure(g: Gathered, expect: Expect = EXPECT):
    """The one failing row (asserting there is exactly one)."""
    bad = [r for r in rows(g, expect) if r.status == "fail"]
    assert len(bad) == 1, bad
    return bad[0]


def test_a_healthy_cluster_passes_every_check_in_order():
    out = rows(healthy())
    assert [r.check for r in out] == list(checks.ORDER)
    assert {r.status for r in out} == {"pass"} and checks.exit_code(out) == 0
    assert all(r.fix is None for r in out)
    link = next(r for r in out if r.check == "link")
    assert "900 Mbit/s" in link.value and "90% of --link-rate 1gbit" in link.value


def test_a_node_that_never_came_is_named_with_the_command_that_starts_it():
    g = healthy()
    g.members, g.facts = [0, 1], {r: g.facts[r] for r in (0, 1)}
    row = only_failure(replace(g, pairs=[pair(0, 1)], clock={}, rundir={}))
    assert (row.check, row.hosts) == ("reachable", "node 2")
    assert "--node-rank 2 --master-addr 10.0.0.1 --master-port 29500" in row.fix
    assert checks.exit_code(rows(g)) == 1


def test_a_node_lost_on_the_way_fails_reachable():
    row = only_failure(replace(healthy(), lost={1: "round/0"}))
    assert row.check == "reachable" and row.hosts == "node 1 (10.0.0.2)" and "round/0" in row.value


def test_a_blocked_rendezvous_port_is_told_from_an_unreachable_node():
    g = healthy()
    g.members, g.probed = [0, 1], [2]
    row = only_failure(replace(g, pairs=[pair(0, 1)]))
    assert row.check == "rendezvous port" and row.hosts == "node 2 (10.0.0.3)"
    assert "port 29501 but not the rendezvous port 10.0.0.1:29500" in row.value and "open TCP port 29500" in row.fix
    g.probe_port, g.probed = None, []  # no probe port: the two cannot be told apart
    assert [r.status for r in rows(g, name="rendezvous port")] == ["warn"]


def test_node_0_that_cannot_host_the_rendezvous_fails_it():
    g = Gathered(nnodes=2, master_addr="10.0.0.9", master_port=29500, timeout_s=20, master_error="port in use",
                 facts={0: facts(0, nnodes=2)}, members=[0])
    row = only_failure(g)
    assert (row.check, row.hosts, row.value) == ("rendezvous port", "node 0", "port in use")


def test_node_ranks_taken_twice_or_a_different_nnodes_fail():
    g = healthy()
    g.strays = [{"rank": 1, "nnodes": 3, "hostname": "host9", "address": "10.0.0.9", "why": "is taken by another node"}]
    row = only_failure(g)
    assert row.check == "node ranks" and row.hosts == "10.0.0.9" and "--node-rank 1 is taken" in row.value
    g = healthy()
    g.facts[2] = replace(g.facts[2], nnodes=4)
    row = only_failure(g)
    assert row.check == "node ranks" and "--nnodes 4, node 0 has --nnodes 3" in row.value


def test_interface_fails_on_a_missing_or_loopback_interface_and_warns_on_a_faster_one():
    g = healthy()
    g.facts[1] = replace(g.facts[1], comm_iface="ib0", comm_address=None)
    row = only_failure(g)
    assert row.check == "interface" and "GLOO_SOCKET_IFNAME=ib0 has no IPv4 address" in row.value
    assert row.fix.startswith("set GLOO_SOCKET_IFNAME=eth0")
    g = healthy()
    g.facts[1].interfaces[1] = Interface("eth0", "10.0.0.2", False, 1000)
    assert "eth0 (the collectives') is down" in only_failure(g).value
    g = healthy()
    g.facts[2] = replace(g.facts[2], comm_iface="lo", comm_address="127.0.1.1", comm_source="hostname")
    row = only_failure(g)
    assert "loopback" in row.value and "/etc/hosts" in row.fix
    g = healthy()
    g.facts[1].interfaces.append(Interface("ib0", "192.168.0.2", True, 100000))
    out = rows(g, name="interface")
    assert [r.status for r in out] == ["warn"] and "ib0 (100000 Mb/s) is up beside eth0 (1000 Mb/s)" in out[0].value
    assert checks.exit_code(rows(g)) == 0  # a warning does not fail the launch
    g = healthy()
    g.facts[1] = replace(g.facts[1], route_iface="eth1")
    assert [r.status for r in rows(g, name="interface")] == ["warn"]


def test_on_one_machine_the_loopback_interface_passes():
    g = healthy(2)
    g.master_addr = "127.0.0.1"
    for r in (0, 1):
        g.facts[r] = replace(g.facts[r], comm_iface="lo", comm_address="127.0.0.1", route_iface="lo",
                             comm_source="hostname")
    assert [r.status for r in rows(g, name="interface")] == ["pass"]


def test_versions_must_agree():
    g = healthy()
    g.facts[2] = replace(g.facts[2], torch="2.0.0", faked=["torch"])
    row = only_failure(g)
    assert row.check == "versions" and row.hosts == "node 2 (10.0.0.3)"
    assert row.value == "torch 2.0.0 on node 2 (10.0.0.3); 2.13.0+cpu elsewhere (faked by SCALETRAIN_FAKE_VERSION)"
    assert row.fix.endswith("2.13.0+cpu")
    g = healthy()
    g.facts[1] = replace(g.facts[1], python="3.11.9")  # another patch level: a warning
    assert [r.status for r in rows(g, name="versions")] == ["warn"]
    g.facts[1] = replace(g.facts[1], python="3.10.4")  # another minor version: pickles and wheels differ
    assert only_failure(g).value.startswith("python 3.10.4")


def test_clocks_beyond_the_tolerance_fail():
    assert rows(healthy(), name="clock")[0].value.startswith("largest offset +2.0 ms (node 2 (10.0.0.3), +/- 1.0 ms)")
    g = healthy()
    g.clock[2] = {"offset_s": -1.5, "rtt_s": 0.002}
    row = only_failure(g)
    assert row.check == "clock" and row.hosts == "node 2 (10.0.0.3)" and "-1.500 s" in row.value
    assert "chrony" in row.fix
    assert only_failure(g, replace(EXPECT, clock_tolerance_s=1.0)).check == "clock"
    assert checks.exit_code(rows(g, replace(EXPECT, clock_tolerance_s=2.0))) == 0


def test_a_run_directory_not_shared_or_not_writable_fails():
    g = healthy()
    g.rundir[2] = {**g.rundir[2], "wrote": False, "error": "No such file or directory", "sees": []}
    row = only_failure(g)
    assert row.check == "run directory" and row.hosts == "node 2 (10.0.0.3)"
    assert "does not see the files of node 0, node 1" in row.value and "mounts at the same path" in row.fix
    g = healthy()
    g.rundir[1] = {**g.rundir[1], "wrote": False, "error": "Permission denied"}
    row = only_failure(g)
    assert "cannot write runs: Permission denied" in row.value and "writable" in row.fix
    g = healthy()  # node 0 could not make its folder: the one cause, not "not shared" on every node
    g.rundir = {r: {**d, "wrote": False, "error": "Read-only file system", "sees": []} for r, d in g.rundir.items()}
    row = only_failure(g)
    assert row.hosts == "node 0 (10.0.0.1)" and row.value == "cannot write runs: Read-only file system"


def test_too_little_free_disk_fails():
    g = healthy()
    g.rundir[1] = {**g.rundir[1], "free_bytes": 0.2e9}
    row = only_failure(g)
    assert row.check == "free disk" and "0.2 GB free (< 1.0 GB)" in row.value


def test_gpus_and_nccl_where_expected():
    assert rows(healthy(), name="GPUs and NCCL")[0].value == "no GPU (none expected)"
    row = only_failure(healthy(), replace(EXPECT, gpus_per_node=4))
    assert row.check == "GPUs and NCCL" and row.hosts.startswith("node 0") and "0 GPUs visible" in row.value
    g = healthy()
    for r in g.facts:
        g.facts[r] = replace(g.facts[r], gpus=4, nccl="2.21.5")
    g.facts[1] = replace(g.facts[1], gpus=2, cuda_visible_devices="0,1")
    row = only_failure(g, replace(EXPECT, gpus_per_node=4))
    assert "2 GPUs visible (CUDA_VISIBLE_DEVICES=0,1), 4 expected" in row.value
    g.facts[1] = replace(g.facts[1], gpus=4)
    assert checks.exit_code(rows(g, replace(EXPECT, gpus_per_node=4))) == 0
    g.facts[2] = replace(g.facts[2], nccl=None)
    assert "no NCCL" in only_failure(g, replace(EXPECT, gpus_per_node=4)).value


def test_a_slow_host_is_blamed_for_its_pairs():
    g = healthy()
    g.pairs = [pair(0, 1), pair(0, 2, 0.01 * GBIT), pair(1, 2, 0.012 * GBIT)]
    row = only_failure(g)
    assert row.check == "link" and row.hosts == "node 2 (10.0.0.3)"
    assert row.value.startswith("10 Mbit/s with node 0 (1%); 12 Mbit/s with node 1 (1%)")
    assert "check node 2's link" in row.fix


def test_a_slow_pair_of_two_nodes_names_the_pair_and_all_failing_pairs_blame_no_one():
    g = healthy(2)
    g.pairs = [pair(0, 1, 0.1 * GBIT)]
    row = only_failure(g)
    assert row.hosts == "node 0 (10.0.0.1) - node 1 (10.0.0.2)" and "--link-rate" in row.fix
    g = healthy()
    g.pairs = [pair(a, b, 0.1 * GBIT) for a, b in ((0, 1), (0, 2), (1, 2))]
    assert [r.hosts for r in rows(g, name="link")] == [f"node {a} (10.0.0.{a + 1}) - node {b} (10.0.0.{b + 1})"
                                                       for a, b in ((0, 1), (0, 2), (1, 2))]


def test_pairs_that_cannot_connect_point_at_the_ports():
    g = healthy()
    g.pairs = [pair(0, 1), pair(0, 2, status="no-connection"), pair(1, 2, status="no-connection")]
    row = only_failure(g)
    assert row.hosts == "node 2 (10.0.0.3)" and "could not connect with node 0" in row.value
    assert "allow all TCP between the nodes" in row.fix


def test_without_a_declared_rate_pairs_are_held_to_the_fastest():
    g = healthy()
    g.pairs = [pair(0, 1, 100e6), pair(0, 2, 90e6), pair(1, 2, 95e6)]
    out = rows(g, Expect(), name="link")
    assert [r.status for r in out] == ["pass"] and "the fastest pair" in out[0].value
    g.pairs[1] = pair(0, 2, 10e6)
    g.pairs[2] = pair(1, 2, 10e6)
    assert only_failure(g, Expect()).hosts == "node 2 (10.0.0.3)"


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_pair_rounds_meet_every_pair_once_in_rounds_of_disjoint_pairs(n):
    rounds = links.pair_rounds(list(range(n)))
    flat = [p for rnd in rounds for p in rnd]
    assert sorted(flat) == [(a, b) for a in range(n) for b in range(a + 1, n)]
    assert all(len({x for p in rnd for x in p}) == 2 * len(rnd) for rnd in rounds)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)


def test_a_pair_is_as_good_as_its_worse_side():
    a = {"a": 0, "b": 1, "bytes": 1000, "seconds": [0.01, 0.02], "status": "ok", "error": None}
    b = {**a, "seconds": [0.02]}
    assert links.merge(a, b)["bytes_per_s"] == pytest.approx(1000 / 0.02)
    assert links.merge(a, {**b, "status": "timeout"})["status"] == "timeout"
    assert links.merge(a, None)["bytes_per_s"] == pytest.approx(1000 / 0.01)


def test_verdict_lines_and_the_json_document():
    g = healthy()
    g.facts[2] = replace(g.facts[2], torch="2.0.0")
    out = rows(g)
    assert summary_line(out) == "fail: versions (1 of 10 checks failed); exit 1"
    assert verdict(out)["code"] == 1
    assert node_line("node 2 (10.0.0.3)", verdict(out)).startswith("doctor: node 2 (10.0.0.3): fail: versions")
    doc = json.loads(json.dumps(document(g, out, EXPECT, 1.5)))
    assert doc["status"] == "fail" and doc["counts"] == {"pass": 9, "warn": 0, "fail": 1}
    assert doc["gathered"]["facts"]["2"]["torch"] == "2.0.0" and doc["expect"]["link_rate"] == "1gbit"
    assert summary_line(rows(healthy())) == "pass: 10 checks; exit 0"


def test_fake_versions_and_link_rates_parse_or_say_what_is_wrong():
    assert fake_versions("torch=2.0.0, python=3.9.1") == {"torch": "2.0.0", "python": "3.9.1"}
    assert fake_versions("") == {}
    with pytest.raises(UserError, match="NAME=VERSION"):
        fake_versions("cuda=12")
    assert parse_rate("1gbit", "--link-rate") == GBIT and parse_rate("100Mbit", "--link-rate") == 100e6 / 8
    for bad in ("fast", "1gb", "-1gbit", "0mbit"):
        with pytest.raises(UserError, match="--link-rate"):
            parse_rate(bad, "--link-rate")


@pytest.mark.parametrize("argv, message", [
    (["--nnodes", "2"], "--nnodes > 1 needs --master-port"),
    (["--nnodes", "2", "--node-rank", "2", "--master-port", "29500"], "--node-rank must be in 0..1"),
    (["--link-rate", "fast"], "--link-rate 'fast' is not a rate"),
    (["--timeout", "0"], "--timeout must be a positive number"),
    (["--master-port", "29500", "--probe-port", "29500"], "--probe-port must be"),
    (["--min-link-fraction", "2"], "--min-link-fraction must be in (0, 1]"),
    (["--json", "/nonexistent-dir/doctor.json"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(["doctor", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_inside_an_allocation_the_node_flags_come_from_slurm(monkeypatch):
    """`srun --ntasks-per-node=1 scaletrain doctor`: each node's task finds the same node 0 and port."""
    import argparse

    from scaletrain.doctor.cli import add_doctor_args, check_args

    parser = argparse.ArgumentParser()
    add_doctor_args(parser)
    env = {"SLURM_NNODES": "3", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu[007-009]", "SLURM_JOB_ID": "4242"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    from scaletrain.distributed.launch import preflight
    monkeypatch.setattr(preflight, "check_address", lambda flag, addr: None)  # gpu007 resolves inside the cluster
    node, _ = check_args(parser.parse_args([]))
    assert (node.nnodes, node.rank, node.master_addr, node.master_port) == (3, 2, "gpu007", 24242)
    node, _ = check_args(parser.parse_args(["--nnodes", "1"]))  # flags given: SLURM's are not asked
    assert (node.nnodes, node.rank, node.master_addr) == (1, 0, "127.0.0.1")


def test_a_bad_fake_version_variable_is_refused(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SCALETRAIN_FAKE_VERSION", "torch")
    assert main(["doctor", "--out", str(tmp_path / "run")]) == 2
    assert "SCALETRAIN_FAKE_VERSION" in capsys.readouterr().err


def _doctor(*argv: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.Popen([sys.executable, "-m", "scaletrain", "doctor", *argv], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _finish(procs: list[subprocess.Popen], guard_s: float = 90) -> list[tuple[int, str, str]]:
    """Wait for every process under a wall-clock guard; whatever still runs (ours alone) is killed."""
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=guard_s)
            out.append((p.returncode, o, e))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def test_two_nodes_on_loopback_pass(tmp_path):
    port = str(free_port("127.0.0.1"))
    common = ["--nnodes", "2", "--master-port", port, "--out", str(tmp_path / "run"), "--link-rate", "100mbit"]
    results = _finish([_doctor(*common, "--node-rank", "0", "--json", str(tmp_path / "d.json")),
                       _doctor(*common, "--node-rank", "1")])
    assert [code for code, _, _ in results] == [0, 0], results
    doc = json.loads((tmp_path / "d.json").read_text())
    assert [c["status"] for c in doc["checks"]] == ["pass"] * 10
    g = doc["gathered"]
    assert g["members"] == [0, 1] and g["pairs"][0]["status"] == "ok" and sorted(g["rundir"]["1"]["sees"]) == [0, 1]
    assert "scaletrain doctor: 2 nodes" in results[0][1] and "pass: 10 checks; exit 0" in results[0][1]
    assert results[1][1].startswith("doctor: node 1 (127.0.0.1): pass: 10 checks")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a second end-to-end launch of doctor: make test-slow (the verdict is checked in-process above)
def test_a_node_that_never_comes_is_named_unreachable_within_the_timeout(tmp_path):
    port = str(free_port("127.0.0.1"))
    (code, out, err), = _finish([_doctor("--nnodes", "2", "--master-port", port, "--timeout", "2", "--out",
                                         str(tmp_path / "run"), "--json", str(tmp_path / "d.json"))], guard_s=60)
    assert code == 1, (out, err)
    doc = json.loads((tmp_path / "d.json").read_text())
    bad = [c for c in doc["checks"] if c["status"] == "fail"]
    assert [(c["check"], c["hosts"]) for c in bad] == [("reachable", "node 1")]
    assert "never reached node 0 at 127.0.0.1 within 2 s" in bad[0]["value"]
    assert "node 1" in out and "fail: reachable" in out


def test_node_0_counts_each_rank_once_and_names_the_strays():
    """The arrival bookkeeping over a real (in-process) store: a rank taken twice, one out of range, one late."""
    import torch.distributed as dist

    from scaletrain.doctor import meet, session

    board = meet.Board(dist.HashStore())
    for rank, address in ((1, "10.0.0.2"), (1, "10.0.0.9"), (5, "10.0.0.6")):
        meet.arrive(board, {"rank": rank, "facts": facts(rank, address=address).to_dict()})
    g = Gathered(nnodes=3, master_addr="10.0.0.1", master_port=29500, timeout_s=0.2, facts={0: facts(0)}, members=[0])
    accepted, seen = session._collect(board, None, g, 0.2)
    assert g.members == [0, 1] and accepted == {1: 1} and seen == 3
    assert [(s["address"], s["why"]) for s in g.strays] == [("10.0.0.9", "is taken by another node"),
                                                           ("10.0.0.6", "is out of range for --nnodes 3")]
    meet.arrive(board, {"rank": 2, "facts": facts(2).to_dict()})  # after the members were named
    session._sweep(board, g, seen)
    assert g.late == [2]
    late = [r for r in rows(g) if r.check == "reachable"]
    assert [r.hosts for r in late] == ["node 2 (10.0.0.3)"] and "after the --timeout of 0.2 s" in late[0].value
    assert rows(g, name="node ranks")[0].status == "fail"
