"""Bad input on train, study, doctor, slurm, testbed and make-imagefolder: one line naming the problem and the
fix, exit 2, nothing written, before any process starts (in-process through main(); nothing here trains)."""

from __future__ import annotations

import socket
import sys
from argparse import Namespace

import pytest

from conftest import one_error_line
from scaletrain.cli import main
from scaletrain.comm import registry
from scaletrain.config import build_config
from scaletrain.config.fields import setting_key
from scaletrain.config.schema import SECTIONS
from scaletrain.config.sections import StrategyConfig
from dataclasses import fields
from scaletrain.errors import UserError


def refused(capsys, tmp_path, argv: list[str], *needles: str) -> str:
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 2
    line = one_error_line(capsys, *needles, quiet=True)
    assert not out.exists()
    return line


# ------------------------------------------------------------------ a setting that applies only with another

@pytest.mark.parametrize("flags, needles", [
    (["--stages", "2"], ["--stages 2 applies only with --strategy pipeline", "has --strategy allreduce",
                         "drop --stages"]),
    (["--microbatches", "8"], ["--microbatches 8 applies only with --strategy pipeline"]),
    (["--split", "uniform"], ["--split uniform applies only with --strategy pipeline"]),
    (["--ps-fetch", "3"], ["--ps-fetch 3 applies only with --strategy ps-async"]),
    (["--strategy", "ps-sync", "--nproc", "2", "--staleness-lr"],
     ["--staleness-lr applies only with --strategy ps-async", "has --strategy ps-sync"]),
    (["--ps-servers", "2", "--nproc", "3"], ["--ps-servers 2 applies only with --strategy ps-sync or ps-async"]),
    (["--strategy", "pipeline", "--nproc", "2", "--bucket-cap-mb", "1"],
     ["--bucket-cap-mb 1.0 applies only with --strategy allreduce or ring"]),
    (["--nproc", "2x2"], ["--nproc 2x2 (stages x replicas) applies only with --strategy pipeline", "--nproc 4"]),
    (["--dataset", "digits", "--synthetic-samples", "100"], ["--synthetic-samples 100 applies only with --dataset "
                                                            "synthetic"]),
    (["--ref-batch", "64"], ["--ref-batch 64 applies only with --scale-lr", "has --no-scale-lr"]),
    (["--persistent-workers"], ["--persistent-workers applies only with --workers 1 or more"]),
    (["--bad-images", "skip"], ["--bad-images skip applies only with --dataset imagefolder:PATH"]),
])
def test_a_setting_without_what_it_needs_is_refused(flags, needles, tmp_path, capsys):
    refused(capsys, tmp_path, ["train", "--model", "mlp", *flags], *needles)


def test_every_strategy_setting_is_declared_by_the_strategies_that_take_it():
    sections = (StrategyConfig, *(SECTIONS[name] for name in set(registry.OPTION_SECTIONS.values())))
    settings = {setting_key(f) for section in sections for f in fields(section) if f.init}
    declared = {o for options in registry.OPTIONS.values() for o in options}
    assert set(registry.OPTIONS) == set(registry.STRATEGIES)
    assert declared <= settings
    # the rest apply to every strategy (offload: its `params` value is checked on its own)
    assert settings - declared == {"strategy", "offload"}


def test_the_check_follows_what_a_strategy_declares(monkeypatch):
    from scaletrain.config import applies

    with pytest.raises(UserError, match="--microbatches 8 applies only with --strategy pipeline"):
        build_config({}, {"microbatches": 8})
    monkeypatch.setitem(registry.OPTIONS, "allreduce", (*registry.OPTIONS["allreduce"], "microbatches"))
    monkeypatch.setattr(applies, "NEEDS", {**applies.NEEDS, **applies._strategy_needs()})
    assert build_config({}, {"microbatches": 8}).pipeline.microbatches == 8


def test_a_setting_at_its_default_or_spelt_none_is_not_set():
    build_config({}, {"strategy": "ring", "compress": "none", "microbatches": 4, "ps_servers": 1})


def test_a_pipeline_on_one_process_says_it_needs_two(tmp_path, capsys):
    line = refused(capsys, tmp_path, ["train", "--model", "mlp", "--strategy", "pipeline"],
                   "--strategy pipeline needs at least 2 processes", "--nproc 2 or more")
    assert "multiple of 1" not in line


@pytest.mark.parametrize("flags, needles", [
    (["--nnodes", "0"], ["--nnodes must be at least 1 (got 0)"]),
    (["--master-addr", "999.1.1.1"], ["--master-addr '999.1.1.1' is not an IP address or a host name"]),
    (["--local-addr", "10.0.0.1 x"], ["--local-addr '10.0.0.1 x' is not an IP address or a host name"]),
])
def test_impossible_node_flags_are_refused(flags, needles, tmp_path, capsys):
    refused(capsys, tmp_path, ["train", "--model", "mlp", *flags], *needles)


def test_a_host_name_that_does_not_resolve_is_refused_before_the_rendezvous(tmp_path, capsys, monkeypatch):
    def no_such_host(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    refused(capsys, tmp_path, ["train", "--model", "mlp", "--master-addr", "node0.nowhere"],
            "--master-addr node0.nowhere is neither an IP address nor a host name that resolves here")


def test_sync_bn_on_cpu_is_refused_before_the_run_directory_is_written(tmp_path, capsys):
    refused(capsys, tmp_path, ["train", "--model", "lenet5", "--device", "cpu", "--sync-bn"], "--sync-bn needs CUDA")


# ------------------------------------------------------------------ study

def test_a_study_leaves_a_setting_out_of_the_points_that_lack_it():
    from scaletrain.study.grid import StudySpec, points

    grid = points(StudySpec(axes={"nproc": [2], "strategy": ["allreduce", "pipeline"]}, train={"stages": 2}))
    assert {p.config.strategy.name: p.config.pipeline.stages for p in grid} == {"allreduce": None, "pipeline": 2}
    grid = points(StudySpec(axes={"nproc": [1], "workers": [0, 2]}, train={"persistent_workers": True}))
    assert [p.config.data.persistent_workers for p in grid] == [False, True]


@pytest.mark.parametrize("flags, needles", [
    (["--nproc", "1,2", "--stages", "2"], ["--stages 2 applies only with --strategy pipeline or spatial, which no point of "
                                           "this study has"]),
    (["--nproc", "1", "--ps-fetch", "3"], ["--ps-fetch 3 applies only with --strategy ps-async"]),
    (["--nproc", "1", "--calibration", "cal.json"], ["--calibration applies only with --predict"]),
    (["--nproc", "1", "--master-addr", "999.1.1.1"], ["is not an IP address or a host name"]),
])
def test_a_study_refuses_a_setting_no_point_uses(flags, needles, tmp_path, capsys):
    refused(capsys, tmp_path, ["study", "--dry-run", "--model", "mlp", *flags], *needles)


# ------------------------------------------------------------------ doctor

@pytest.mark.parametrize("flags, needles", [
    (["--link-rate", "1gbps"], ["--link-rate '1gbps' is not a rate in bits per second", "write bit", "1gbit"]),
    (["--link-rate", "fast"], ["--link-rate 'fast' is not a rate in bits per second", "1gbit"]),
    (["--master-addr", "999.1.1.1", "--master-port", "29511"], ["--master-addr '999.1.1.1' is not an IP address"]),
    (["--nnodes", "0"], ["--nnodes must be at least 1 (got 0)"]),
])
def test_doctor_refuses_bad_flags_in_one_line_before_meeting(flags, needles, capsys):
    assert main(["doctor", *flags]) == 2
    one_error_line(capsys, *needles, quiet=True)


def test_doctor_refuses_a_master_host_name_that_does_not_resolve(capsys, monkeypatch):
    def no_such_host(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    assert main(["doctor", "--master-addr", "node0.nowhere", "--master-port", "29511"]) == 2
    one_error_line(capsys, "--master-addr node0.nowhere is neither an IP address nor a host name that resolves",
                   quiet=True)


# ------------------------------------------------------------------ slurm

UNREACHABLE = ("sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
               "sbatch: error: fetch_config: DNS SRV lookup failed\n"
               "sbatch: error: _establish_config_source: failed to fetch config\n"
               "sbatch: fatal: Could not establish a configuration source\n")


@pytest.mark.parametrize("command", [["train", "--model", "mlp"], ["study", "--model", "mlp", "--nproc", "1,2"]])
def test_slurm_without_a_reachable_controller_is_one_line_and_writes_nothing(command, tmp_path, monkeypatch,
                                                                             capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "squeue", "sinfo"):
        (bin_dir / name).write_text(f"#!/bin/sh\ncat >&2 <<'EOF'\n{UNREACHABLE.replace('sbatch', name)}EOF\nexit 1\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    refused(capsys, tmp_path, ["slurm", *command], "no SLURM controller is reachable from here",
            "Could not establish a configuration source", "login node", "--dry-run")


# ------------------------------------------------------------------ testbed

def test_testbed_run_starts_the_scaletrain_it_was_started_from(tmp_path, monkeypatch):
    from scaletrain.testbed.run import resolve_command

    monkeypatch.setenv("PATH", str(tmp_path))  # no scaletrain (nor anything else) on PATH
    assert resolve_command(["scaletrain", "train", "--nproc", "1"]) == [sys.executable, "-m", "scaletrain", "train",
                                                                        "--nproc", "1"]
    assert resolve_command([sys.executable, "-c", "pass"]) == [sys.executable, "-c", "pass"]
    with pytest.raises(UserError, match="`nosuchprogram` is neither a program on PATH nor an executable file"):
        resolve_command(["nosuchprogram", "--flag"])


@pytest.mark.parametrize("rate, needle", [("1gbps", "'bps' is bytes per second to tc"), ("fast", "is not a rate"),
                                          ("0gbit", "is not a rate")])
def test_testbed_refuses_a_rate_it_would_misread(rate, needle):
    from scaletrain.testbed.plan import make_testbed

    with pytest.raises(UserError, match=needle):
        make_testbed(2, rate, "0ms")
    assert make_testbed(2, "100Mbit", "0ms").rate == "100mbit"


def test_testbed_run_refuses_a_shape_other_than_the_testbed_that_is_up(capsys):
    from scaletrain.testbed import cli
    from scaletrain.testbed.plan import make_testbed

    up = make_testbed(2, "1gbit", "0ms")
    net = Namespace(current=lambda: up)
    args = Namespace(argv=["--", "scaletrain", "train"], hosts=None, rate="100mbit", delay=None, cores_per_host=None)
    with pytest.raises(UserError, match="a testbed with --rate 1gbit is up, not 100mbit"):
        cli._run(None, net, args, make_testbed)


# ------------------------------------------------------------------ make-imagefolder

@pytest.mark.parametrize("flags, needle", [
    (["--seed", "-1"], "--seed must be in 0..4294967295 (got -1)"),
    (["--image-size", "70000"], "more than a JPEG can hold (65535 pixels a side)"),
    (["--image-size", "60000"], "of memory per image"),
    (["--copies", "0"], "--copies 0 must be at least 1"),
])
def test_make_imagefolder_refuses_before_writing(flags, needle, tmp_path, capsys, monkeypatch):
    from scaletrain.perf import footprint

    monkeypatch.setattr(footprint, "available_bytes", lambda device: 2 ** 30)  # 1 GiB, whatever this machine has
    refused(capsys, tmp_path, ["make-imagefolder", *flags], needle)
    assert list(tmp_path.iterdir()) == []

