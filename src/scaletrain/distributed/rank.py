"""Who this process is: rank identity read once from torchrun/SLURM variables (the one place that reads them)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from scaletrain.errors import UserError

@dataclass(frozen=True, slots=True)
class RankInfo:
    """Who this process is in the job; built once from the environment and passed explicitly."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def within(self, world_size: int) -> "RankInfo":
        """This process's view of a sub-job made of the job's first `world_size` ranks (a parameter-server
        job's workers): the same rank in a world of `world_size`. The local ranks stay the node's processes
        (servers included): they share its cores."""
        if not 0 <= self.rank < world_size:
            raise ValueError(f"rank {self.rank} is not among the first {world_size} ranks")
        return RankInfo(self.rank, self.local_rank, world_size, max(1, self.local_world_size))

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "RankInfo":
        env = dict(os.environ if env is None else env)
        if "RANK" in env and "WORLD_SIZE" in env:  # torchrun / elastic agent
            world = int(env["WORLD_SIZE"])
            return cls(int(env["RANK"]), int(env.get("LOCAL_RANK", 0)), world,
                       int(env.get("LOCAL_WORLD_SIZE", world)))
        if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:  # srun, one task per device
            world = int(env["SLURM_NTASKS"])
            local_world = int(env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0] or 0) or world
            return cls(int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", 0)), world, local_world)
        return cls(0, 0, 1, 1)


def restart_count(env: dict[str, str] | None = None) -> int:
    """How many times the elastic agent has restarted this worker's group (0: the first attempt)."""
    env = os.environ if env is None else env
    return int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def launched_externally(env: dict[str, str] | None = None, node_flags: bool = False) -> bool:
    """True when torchrun or srun already started this process as one worker of a job. Under srun with
    `node_flags` (--nnodes given: one launch agent per node, as `scaletrain slurm` starts them), this process
    is a node's launcher, not a worker."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return True
    return not node_flags and "SLURM_PROCID" in env and "SLURM_NTASKS" in env and int(env["SLURM_NTASKS"]) > 1


def slurm_rendezvous(env: dict[str, str]) -> dict[str, str]:
    """MASTER_ADDR/PORT for an srun launch: the first host of the node list, a port from the job id."""
    out = {}
    if "MASTER_ADDR" not in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise UserError("SLURM launch without a node list: set MASTER_ADDR to the first node's address")
        out["MASTER_ADDR"] = first_slurm_host(nodelist)
    if "MASTER_PORT" not in env:
        out["MASTER_PORT"] = str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)
    return out


def slurm_node_flags(env: dict[str, str] | None = None) -> dict[str, object] | None:
    """Inside a SLURM allocation of several nodes, in a task started by `srun --ntasks-per-node=1`: the node
    flags its nodes share (nnodes, node_rank, master_addr = the first host, master_port from the job id);
    None elsewhere."""
    env = dict(os.environ if env is None else env)
    if "SLURM_NODEID" not in env or int(env.get("SLURM_NNODES", "1") or 1) < 2:
        return None
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    return {"nnodes": int(env["SLURM_NNODES"]), "node_rank": int(env["SLURM_NODEID"]),
            "master_addr": first_slurm_host(nodelist),
            "master_port": 20000 + int(env.get("SLURM_JOB_ID", "0") or 0) % 20000}


def first_slurm_host(nodelist: str) -> str:
    """First host of a SLURM hostlist such as 'gpu[003-005,010],cpu01' -> 'gpu003'."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\]([^,]*))?", nodelist.strip())
    if not m:
        raise UserError(f"cannot read SLURM node list {nodelist!r}: set MASTER_ADDR explicitly")
    prefix, ranges, suffix = m.group(1), m.group(2), m.group(3) or ""
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0] + suffix
