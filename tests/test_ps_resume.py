"""Resuming a parameter-server run: ps-sync continues bit for bit, ps-async continues the servers' versions
(with the ranks in-process, the `launch` fixture, and through the real CLI, slow); a resume on another
layout is refused in one line (in-process through main(), and from the command line, slow)."""

import json

import pytest
import torch

from conftest import scaletrain, summary
from scaletrain.cli import build_parser, main
from scaletrain.distributed.launch.preflight import preflight
from scaletrain.train.cli import train_config
from scaletrain.train import checkpoint
from scaletrain.analysis import load_records

BASE = ("--model", "lenet5", "--dataset", "digits", "--batch-size", "32", "--no-progress")
SYNC = (*BASE, "--strategy", "ps-sync", "--nproc", "3", "--ps-servers", "1", "--epochs", "2", "--lr", "0.05",
        "--optimizer", "nesterov", "--warmup-epochs", "0.5", "--compress", "topk:0.1")


def _ckpt(run):
    return torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")  # three launches: about 50 s on 2 busy cores through the CLI, 5 s in-process
def sync_runs(tmp_path_factory, launch):
    """2 workers + 1 server, 2 epochs, with and without a break after the first (top-k: error feedback
    on the workers; nesterov and warm-up: momentum and schedule on the server)."""
    base = tmp_path_factory.mktemp("ps-resume")
    straight, broken = base / "straight", base / "broken"
    launch(*SYNC, "--out", str(straight))
    launch(*SYNC, "--stop-after", "1", "--out", str(broken))
    assert summary(broken)["status"] == "stopped"
    first = _ckpt(broken)
    launch("--resume", "--out", str(broken))
    return straight, broken, first


@pytest.mark.slow  # three trainings of a parameter server: ps-sync = allreduce stays in the fast suite
def test_ps_sync_resume_equals_an_uninterrupted_run(sync_runs):
    straight, broken, first = sync_runs
    ps = first["ps"]
    assert ps["workers"] == 2 and len(ps["servers"]) == 1 and len(ps["clients"]) == 2
    server = ps["servers"][0]
    assert server["step"] == first["global_step"] and server["log"]["updates"] == first["global_step"]
    assert server["optimizer"]["state"] and all(s["momentum_buffer"] is not None
                                                for s in server["optimizer"]["state"].values())
    assert ps["clients"][1]["compressor"]["residuals"]  # top-k's error feedback, per worker
    a, b = _ckpt(straight), _ckpt(broken)
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    for x, y in zip(a["ps"]["servers"][0]["values"], b["ps"]["servers"][0]["values"]):
        assert torch.equal(x, y)
    sa, sb = summary(straight), summary(broken)
    assert sb["status"] == "completed" and sb["epochs"] == 2 and sa["top1"] == sb["top1"]
    assert sb["ps"]["updates_per_shard"] == [sb["steps"]] == [sa["steps"]]  # the servers' counters continue
    assert [r["loss"] for r in load_records(broken)[1]] == [r["loss"] for r in load_records(straight)[1]]


def _checkpoint_of_a_ps_sync_run_on_3_processes(run_dir, **more):
    config = {"model": "lenet5", "dataset": "digits", "strategy": "ps-sync", "nproc": 3, "nnodes": 1,
              "ps_servers": 1, "batch_size": 32}
    ps = {"workers": 2, "servers": [{}], "clients": [{}, {}]}
    checkpoint.save_atomic({"format": checkpoint.FORMAT, "config": config, "ps": ps, **more},
                           run_dir / "checkpoint.pt")


LAYOUT_REFUSED = "holds 1 parameter server for 2 workers"
AS_STARTED = "resume with --nproc 3 --ps-servers 1 as the run was started"


def test_ps_resume_on_another_layout_is_refused_in_process(tmp_path, capsys):
    _checkpoint_of_a_ps_sync_run_on_3_processes(tmp_path)
    before = (tmp_path / "checkpoint.pt").read_bytes()
    assert main(["train", *BASE, "--strategy", "ps-sync", "--resume", "--out", str(tmp_path), "--nproc", "4"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and LAYOUT_REFUSED in err[0], err
    assert err[0].endswith(AS_STARTED)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # refused before writing anything
    assert (tmp_path / "checkpoint.pt").read_bytes() == before


def test_ps_resume_on_the_same_layout_notes_no_change_of_processes(tmp_path, capsys):
    """The checkpoint counts the 2 workers that train; the launch's 3 processes add the server: the same run,
    not "trained with 2 processes, this resume uses 3" (the note a resume on other ranks gets)."""
    _checkpoint_of_a_ps_sync_run_on_3_processes(tmp_path, world_size=2, epoch=1)
    args = ["train", *BASE, "--strategy", "ps-sync", "--nproc", "3", "--resume", "--out", str(tmp_path)]
    preflight(train_config(build_parser().parse_args(args)))
    assert capsys.readouterr().err == ""


@pytest.mark.slow  # a launch: the same refusal in-process above
def test_ps_resume_on_another_layout_is_refused(tmp_path):
    """Every rank refuses before the ranks meet: one line, no rank left waiting for a peer."""
    _checkpoint_of_a_ps_sync_run_on_3_processes(tmp_path)
    proc = scaletrain("train", *BASE, "--strategy", "ps-sync", "--resume", "--out", str(tmp_path), "--nproc", "4",
                      timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    first_line = proc.stderr.splitlines()[0]
    assert first_line.startswith("error: ") and LAYOUT_REFUSED in first_line
    assert first_line.endswith(AS_STARTED)


@pytest.mark.slow  # 3 ranks on 2 cores; ps-sync's resume stays fast
def test_ps_async_resume_continues_the_servers_versions(launch, tmp_path):
    run = tmp_path / "run"
    args = (*BASE, "--strategy", "ps-async", "--nproc", "3", "--epochs", "2", "--lr", "0.01", "--out", str(run))
    launch(*args, "--stop-after", "1")
    first = _ckpt(run)
    version = first["ps"]["servers"][0]["version"]
    assert first["epoch"] == 1 and version > 0 and len(first["ps"]["clients"]) == 1
    launch("--resume", "--out", str(run))
    s = summary(run)
    assert s["status"] == "completed" and s["epochs"] == 2
    records = load_records(run)
    per_epoch = s["steps"] // 2
    for rank in (0, 1):  # every worker ran epoch 2 again from the checkpoint, each step once
        assert [r["step"] for r in records[rank] if r["epoch"] == 1] == list(range(per_epoch, 2 * per_epoch))
    # the version went on from the checkpoint's: the resumed epoch's pushes (2 workers) came on top of it
    assert s["ps"]["updates_per_shard"] == [version + 2 * per_epoch]
    server = json.loads((run / "ps-server0.json").read_text())
    assert min(w["updates_at_end"] for w in server["workers"].values()) > version
    # the workers fetched the continued versions. Between a worker's fetch and its push only the other worker's
    # pushes count, so whichever worker pushed first after the resume was 0 updates stale, and no push can be
    # more stale than the other worker's whole resumed epoch (a starved worker on 2 busy cores was seen to wait
    # it out: 22 of 22). A push read from version 0 would be `version` or more stale, the first ones included.
    resumed = {rank: [r["staleness"] for r in records[rank] if r["epoch"] == 1] for rank in (0, 1)}
    assert min(resumed[0][0], resumed[1][0]) == 0, resumed
    assert max(max(lags) for lags in resumed.values()) <= per_epoch, resumed
