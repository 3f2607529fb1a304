"""The process environment (distributed/env.py): what a launched child inherits, the C++ log level, the testbed's
state file."""

import os
from pathlib import Path

from scaletrain.distributed import env as dist_env
from scaletrain.distributed.env import JOIN_VARS, child_env, quiet_torch_cpp_logs


def test_child_env_drops_the_join_variables():
    env = child_env({"PATH": "/bin", **{v: "1" for v in JOIN_VARS}})
    assert env == {"PATH": "/bin"}


def test_child_env_reads_this_process_by_default_and_leaves_it_alone(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("SCALETRAIN_KEEP", "yes")
    env = child_env()
    assert "RANK" not in env and "MASTER_PORT" not in env and env["SCALETRAIN_KEEP"] == "yes"
    assert os.environ["RANK"] == "3"  # a copy: this process still joins as it did


def test_the_join_variables_are_what_torchrun_and_srun_set():
    assert {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"} <= set(JOIN_VARS)
    assert {"SLURM_PROCID", "SLURM_NTASKS"} <= set(JOIN_VARS)


def test_torch_cpp_logs_are_quietened_unless_the_user_chose_a_level(monkeypatch):
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    quiet_torch_cpp_logs()
    assert os.environ["TORCH_CPP_LOG_LEVEL"] == "FATAL"
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "WARNING")
    quiet_torch_cpp_logs()
    assert os.environ["TORCH_CPP_LOG_LEVEL"] == "WARNING"


def test_testbed_state_path_defaults_under_run_and_can_be_moved(monkeypatch, tmp_path):
    monkeypatch.delenv("SCALETRAIN_TESTBED_STATE", raising=False)
    assert dist_env.testbed_state_path() == Path("/run/scaletrain-testbed.json")
    monkeypatch.setenv("SCALETRAIN_TESTBED_STATE", str(tmp_path / "tb.json"))
    assert dist_env.testbed_state_path() == tmp_path / "tb.json"
