"""Resuming a parameter-server run: the checkpoint's `ps` entry, checked before any process meets.

Every rank calls `saved_state` first (a refusal then ends every process alike, before a link waits for
a peer); a server takes its entry of `servers` and loads it before it sends anything (ps/server.py),
the workers take theirs from `clients` (ps/client.py) after the rest of the checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaletrain.train import checkpoint
from scaletrain.config import TrainConfig
from scaletrain.errors import UserError
from scaletrain.rundir import RunDir


def saved_state(cfg: TrainConfig, world_size: int) -> dict[str, Any]:
    """The `ps` entry of the run's checkpoint, if it can continue on `world_size` processes as `cfg` says."""
    path = RunDir(Path(cfg.launch.out)).checkpoint
    ckpt = checkpoint.load(path, mmap=True)  # mapped: each rank reads only what it uses
    old = ckpt["config"]
    if old.get("strategy") != cfg.strategy.name:
        raise UserError(f"checkpoint {path} was written by --strategy {old.get('strategy')}, not {cfg.strategy.name} "
                        f"(its optimizer state lives elsewhere): resume with --strategy {old.get('strategy')}")
    ps = ckpt.get("ps")
    if ps is None:
        raise UserError(f"checkpoint {path} holds no parameter-server state (written by a scaletrain that "
                        "could not resume --strategy ps-*): start a new run with another --out")
    workers, servers = ps["workers"], len(ps["servers"])
    if (workers, servers) != (world_size - cfg.ps.servers, cfg.ps.servers):
        raise UserError(f"checkpoint {path} holds {_count(servers, 'parameter server')} for "
                        f"{_count(workers, 'worker')}, this launch has {cfg.ps.servers} for "
                        f"{world_size - cfg.ps.servers} (shards and data order depend on both): resume with "
                        f"{_launch_flags(old, workers + servers)} --ps-servers {servers} as the run was started")
    return ps


def _launch_flags(old: dict[str, Any], processes: int) -> str:
    nproc, nnodes = old.get("nproc", 0), old.get("nnodes", 1)
    if nproc * nnodes != processes:  # started by torchrun or srun: name the count, not the flags
        return f"{processes} processes"
    return f"--nproc {nproc}" + (f" --nnodes {nnodes}" if nnodes > 1 else "")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"
