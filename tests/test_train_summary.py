"""summary.json's writer (train/summary.py): the short form of a run that failed, and where a run sat on its
machine. (A finished run's summary, written at the end of training: test_train_ddp.py.)"""

import json

import torch

from scaletrain.config import build_config
from scaletrain.distributed.device import machine_cores
from scaletrain.distributed.rank import RankInfo
from scaletrain.distributed.allocator import settle
from scaletrain.rundir import RunDir
from scaletrain.train import summary


def _cfg(**kw):
    return build_config({}, {"model": "mlp", "dataset": "digits", "epochs": 5, **kw})


def test_a_failed_run_gets_the_short_form_counting_its_whole_epochs(tmp_path):
    run = RunDir(tmp_path)
    run.epochs.write_text('{"epoch": 0}\n{"epoch": 1}\n{"epoch": 2, "top')  # killed while writing epoch 3
    (tmp_path / "summary.json").write_text('{"status": "completed"}')  # an older attempt's
    summary.failed(run, _cfg(nproc=3), "rank 1 was killed by SIGKILL")
    assert json.loads(run.summary.read_text()) == {
        "status": "failed", "error": "rank 1 was killed by SIGKILL", "model": "mlp", "dataset": "digits",
        "world_size": 3, "epochs": 2, "epochs_planned": 5, "resumable": False, "restarts": []}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # written atomically


def test_a_failed_run_with_a_checkpoint_is_resumable_and_one_without_epochs_says_zero(tmp_path):
    run = RunDir(tmp_path)
    run.checkpoint.write_bytes(b"a checkpoint")
    summary.failed(run, _cfg(), "interrupted (SIGTERM)")
    written = json.loads(run.summary.read_text())
    assert written["resumable"] is True and written["epochs"] == 0 and written["world_size"] == 1


def test_placement_says_how_a_cpu_run_sat_on_its_machine():
    where = summary.placement(torch.device("cpu"), RankInfo(1, 1, 4, 2))
    assert where == {"device": "cpu", "local_world_size": 2, "threads_per_rank": torch.get_num_threads(),
                     "cpu_cores": machine_cores(), "testbed": False, **settle()}
    assert where["malloc"] == "glibc, thresholds fixed"  # and the allocator it ran under (distributed/allocator.py)


def test_exchange_names_the_gradients_and_which_communication_levers_apply():
    from types import SimpleNamespace

    from scaletrain.comm.registry import STRATEGIES, strategy_class

    model = torch.nn.Linear(10, 2)  # 22 fp32 parameters
    model.bias.requires_grad_(False)  # a frozen parameter has no gradient to send
    def strategy(name):  # the class's facts, without joining a process group
        cls = strategy_class(name)
        return SimpleNamespace(gradient_buckets=cls.gradient_buckets, exchange_settings=cls.exchange_settings,
                               lockstep=cls.lockstep, cfg=SimpleNamespace(strategy=SimpleNamespace(name=name)))

    facts = {name: summary.exchange(strategy(name), model) for name in STRATEGIES}
    assert {f["gradient_bytes"] for f in facts.values()} == {20 * 4}
    assert {n for n, f in facts.items() if f["gradient_buckets"]} == {"allreduce", "ring"}  # DDP's buckets
    assert {n for n, f in facts.items() if f["compressible"]} == {"allreduce", "ps-sync", "ps-async"}
    assert {n for n, f in facts.items() if not f["lockstep"]} == {"ps-async"}  # its workers hold no one back
    assert {n: f["exchange_settings"] for n, f in facts.items() if f["exchange_settings"]} == {
        "ps-sync": ["ps_servers"], "ps-async": ["ps_servers", "ps_push"]}
