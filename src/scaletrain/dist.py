"""Rank identity (read once from torchrun/SLURM variables), device choice and process-group set-up."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

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


def launched_externally(env: dict[str, str] | None = None) -> bool:
    """True when torchrun or srun already started this process as one worker of a job."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return True
    return "SLURM_PROCID" in env and "SLURM_NTASKS" in env and int(env["SLURM_NTASKS"]) > 1


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


def first_slurm_host(nodelist: str) -> str:
    """First host of a SLURM hostlist such as 'gpu[003-005,010],cpu01' -> 'gpu003'."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\]([^,]*))?", nodelist.strip())
    if not m:
        raise UserError(f"cannot read SLURM node list {nodelist!r}: set MASTER_ADDR explicitly")
    prefix, ranges, suffix = m.group(1), m.group(2), m.group(3) or ""
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0] + suffix


def choose_device(requested: str, rank: RankInfo) -> torch.device:
    """CUDA (one GPU per local rank) when present and allowed, else CPU."""
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError("--device cuda asked for, but no CUDA GPU is visible: use --device cpu")
    return torch.device("cuda", rank.local_rank % torch.cuda.device_count())


def check_device_request(requested: str, nproc: int, precision: str) -> str:
    """Validate --device/--nproc/--precision against this machine before launching; returns the device type."""
    has_cuda = torch.cuda.is_available()
    device_type = "cuda" if requested == "cuda" or (requested == "auto" and has_cuda) else "cpu"
    if device_type == "cuda":
        if not has_cuda:
            raise UserError("--device cuda asked for, but no CUDA GPU is visible: use --device cpu")
        if nproc > torch.cuda.device_count():
            raise UserError(f"--nproc {nproc} asks for more GPUs than the {torch.cuda.device_count()} visible: "
                            f"use --nproc {torch.cuda.device_count()} or fewer")
    if precision == "fp16" and device_type == "cpu":
        raise UserError("--precision fp16 needs a CUDA GPU (CPU autocast has no fp16 GradScaler path): "
                        "use --precision bf16 on CPU")
    return device_type


# Set by `scaletrain testbed run` in each host's environment: the cores that host's processes may use,
# when several virtual hosts share one machine's cores.
CORES_ENV = "SCALETRAIN_CORES"


def machine_cores(env: dict[str, str] | None = None) -> int:
    """Cores this node's ranks share: $SCALETRAIN_CORES when a testbed host sets it, else the affinity mask."""
    env = os.environ if env is None else env
    if env.get(CORES_ENV, "").strip().isdigit() and int(env[CORES_ENV]) > 0:
        return int(env[CORES_ENV])
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_threads_per_rank(local_world_size: int, requested: int | None = None) -> int:
    """Intra-op threads so that the local ranks share the cores instead of oversubscribing them."""
    if requested:
        return requested
    return max(1, machine_cores() // max(1, local_world_size))


def init_process_group(device: torch.device, rank: RankInfo, timeout_s: float = 300) -> str:
    """NCCL for CUDA, gloo for CPU; returns the backend name."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if rank.world_size > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, rank=rank.rank, world_size=rank.world_size,
                                timeout=timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    return backend


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks in place (no-op in a single process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def gather_objects(obj):
    """Every rank's object as a list indexed by rank (just [obj] in a single process)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
