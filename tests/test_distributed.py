"""Tests for rank identity, SLURM helpers and device checks (no process group is started)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from scaletrain.distributed.rank import RankInfo, first_slurm_host, launched_externally, slurm_rendezvous
from scaletrain.distributed.device import check_device_request, choose_device, cpu_threads_per_rank
from scaletrain.errors import UserError

ALL_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
            "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")


def as_tuple(r: RankInfo) -> tuple[int, int, int, int]:
    return r.rank, r.local_rank, r.world_size, r.local_world_size


# ------------------------------------------------------------------ RankInfo

def test_from_env_torchrun():
    r = RankInfo.from_env({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"})
    assert as_tuple(r) == (5, 1, 8, 4)
    assert not r.is_main


def test_from_env_torchrun_without_local_variables():
    assert as_tuple(RankInfo.from_env({"RANK": "0", "WORLD_SIZE": "3"})) == (0, 0, 3, 3)


def test_torchrun_variables_win_over_slurm():
    env = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert as_tuple(RankInfo.from_env(env)) == (2, 0, 4, 1)


@pytest.mark.parametrize("per_node, local_world", [("4(x2)", 4), ("4", 4), ("2(x3)", 2)])
def test_from_env_slurm(per_node, local_world):
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": per_node}
    assert as_tuple(RankInfo.from_env(env)) == (5, 1, 8, local_world)


def test_from_env_slurm_without_tasks_per_node_assumes_one_node():
    r = RankInfo.from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "3"})
    assert as_tuple(r) == (0, 0, 3, 3) and r.is_main


def test_from_env_nothing_is_a_single_process():
    r = RankInfo.from_env({})
    assert as_tuple(r) == (0, 0, 1, 1) and r.is_main


def test_from_env_partial_variables_are_a_single_process():
    assert as_tuple(RankInfo.from_env({"RANK": "3"})) == (0, 0, 1, 1)
    assert as_tuple(RankInfo.from_env({"SLURM_PROCID": "3"})) == (0, 0, 1, 1)


def test_from_env_reads_os_environ_by_default(monkeypatch):
    for var in ALL_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert as_tuple(RankInfo.from_env()) == (1, 0, 2, 2)


def test_rank_info_is_frozen():
    r = RankInfo(0, 0, 1, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.rank = 3
    assert r.rank == 0
    assert r == RankInfo(0, 0, 1, 1) and hash(r) == hash(RankInfo(0, 0, 1, 1))


# ------------------------------------------------------------------ launched_externally

@pytest.mark.parametrize("env, expected", [
    ({}, False),
    ({"RANK": "0", "WORLD_SIZE": "1"}, True),
    ({"RANK": "0"}, False),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, False),  # a 1-task sbatch: we launch our own workers
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "4"}, True),
    ({"SLURM_PROCID": "1"}, False),
])
def test_launched_externally(env, expected):
    assert launched_externally(env) is expected


def test_one_launch_agent_per_node_under_srun_launches_instead_of_joining():
    slurm = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}  # srun --ntasks-per-node=1 on 2 nodes, --nnodes 2
    assert launched_externally(slurm, node_flags=True) is False
    assert launched_externally({"RANK": "1", "WORLD_SIZE": "2"}, node_flags=True) is True  # torchrun's worker


def test_launched_externally_reads_os_environ(monkeypatch):
    for var in ALL_VARS:
        monkeypatch.delenv(var, raising=False)
    assert launched_externally() is False
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert launched_externally() is True


# ------------------------------------------------------------------ SLURM helpers

@pytest.mark.parametrize("nodelist, host", [
    ("gpu[003-005,010],cpu01", "gpu003"),
    ("node7", "node7"),
    ("a[1,3]", "a1"),
    ("node7,node8", "node7"),
    ("  c[10-12]", "c10"),
])
def test_first_slurm_host(nodelist, host):
    assert first_slurm_host(nodelist) == host


@pytest.mark.parametrize("nodelist", ["", "[1-3]", ",node1"])
def test_unreadable_node_list_is_a_user_error(nodelist):
    with pytest.raises(UserError, match="MASTER_ADDR"):
        first_slurm_host(nodelist)


def test_slurm_rendezvous_first_host_and_port_from_job_id():
    out = slurm_rendezvous({"SLURM_JOB_NODELIST": "gpu[003-005,010],cpu01", "SLURM_JOB_ID": "123456"})
    assert out == {"MASTER_ADDR": "gpu003", "MASTER_PORT": str(20000 + 123456 % 20000)}
    assert out["MASTER_PORT"] == "23456"


def test_slurm_rendezvous_prefers_the_step_node_list():
    env = {"SLURM_STEP_NODELIST": "s[5-6]", "SLURM_JOB_NODELIST": "j[1-9]", "SLURM_NODELIST": "n1",
           "SLURM_JOB_ID": "7"}
    assert slurm_rendezvous(env) == {"MASTER_ADDR": "s5", "MASTER_PORT": "20007"}
    assert slurm_rendezvous({"SLURM_NODELIST": "n1", "SLURM_JOB_ID": "7"})["MASTER_ADDR"] == "n1"


@pytest.mark.parametrize("job_id", ["0", "19999", "20000", "987654321"])
def test_slurm_port_is_in_a_safe_range(job_id):
    port = int(slurm_rendezvous({"SLURM_NODELIST": "n1", "SLURM_JOB_ID": job_id})["MASTER_PORT"])
    assert 20000 <= port < 40000


def test_slurm_rendezvous_keeps_existing_master_variables():
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "SLURM_JOB_NODELIST": "gpu[1-2]",
           "SLURM_JOB_ID": "42"}
    assert slurm_rendezvous(env) == {}
    only_addr = slurm_rendezvous({"MASTER_ADDR": "10.0.0.1", "SLURM_JOB_ID": "42"})
    assert only_addr == {"MASTER_PORT": "20042"}


def test_slurm_rendezvous_without_node_list_is_a_user_error():
    with pytest.raises(UserError, match="MASTER_ADDR"):
        slurm_rendezvous({"SLURM_JOB_ID": "1"})


# ------------------------------------------------------------------ device checks

@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


@pytest.mark.parametrize("requested", ["cpu", "auto"])
def test_fp16_on_cpu_suggests_bf16(no_cuda, requested):
    with pytest.raises(UserError) as e:
        check_device_request(requested, 1, "fp16")
    assert "--precision fp16" in str(e.value) and "bf16" in str(e.value)


def test_cpu_requests_pass_without_a_gpu(no_cuda):
    assert check_device_request("auto", 4, "fp32") == "cpu"
    assert check_device_request("cpu", 4, "bf16") == "cpu"


def test_cuda_without_gpu_is_a_user_error(no_cuda):
    with pytest.raises(UserError, match="--device cpu"):
        check_device_request("cuda", 1, "fp32")
    with pytest.raises(UserError, match="no CUDA GPU"):
        choose_device("cuda", RankInfo(0, 0, 1, 1))
    assert choose_device("auto", RankInfo(0, 0, 1, 1)) == torch.device("cpu")


def test_more_ranks_than_gpus_names_the_gpu_count(one_gpu):
    with pytest.raises(UserError) as e:
        check_device_request("auto", 2, "fp32")
    msg = str(e.value)
    assert "--nproc 2" in msg and "1 visible" in msg and "--nproc 1" in msg


def test_gpu_requests_pass_with_enough_gpus(one_gpu):
    assert check_device_request("auto", 1, "fp16") == "cuda"
    assert check_device_request("cuda", 1, "bf16") == "cuda"
    # --device cpu ignores the GPU, so it may use more ranks but not fp16
    assert check_device_request("cpu", 2, "fp32") == "cpu"
    with pytest.raises(UserError, match="bf16"):
        check_device_request("cpu", 1, "fp16")


def test_choose_device_maps_local_rank_to_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert choose_device("auto", RankInfo(3, 3, 4, 4)) == torch.device("cuda", 1)
    assert choose_device("cpu", RankInfo(3, 3, 4, 4)) == torch.device("cpu")


# ------------------------------------------------------------------ threads

def test_threads_requested_are_kept():
    assert cpu_threads_per_rank(4, requested=3) == 3


@pytest.mark.parametrize("local_world, threads", [(1, 8), (2, 4), (3, 2), (8, 1), (16, 1), (0, 8)])
def test_threads_share_the_available_cores(monkeypatch, local_world, threads):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert cpu_threads_per_rank(local_world) == threads


def test_first_slurm_host_keeps_a_suffix_after_the_range():
    assert first_slurm_host("node[1-2]-ib,login") == "node1-ib"


def _timed_collective(rank: int, world: int) -> tuple[float, float, float]:
    import time

    import torch.distributed as dist
    from multirank import group

    from scaletrain.distributed.group import largest, time_collective

    with group():
        device = torch.device("cpu")
        buf = torch.ones(4)

        def exchange() -> None:  # rank 1 arrives 20 ms late to each all-reduce: every rank waits for it
            if rank == 1:
                time.sleep(0.02)
            dist.all_reduce(buf)

        mine = time_collective(exchange, 3, device)
        return mine, largest(mine, device), largest(float(rank), device)


def test_a_collective_is_timed_as_its_slowest_rank(ranks):
    results = ranks.run(_timed_collective, 2)
    assert [r[2] for r in results] == [1.0, 1.0]  # `largest` is every rank's maximum
    assert results[0][1] == results[1][1] == max(r[0] for r in results)
    assert all(r[0] >= 0.02 for r in results)  # rank 0 waits in the all-reduce for the late rank
