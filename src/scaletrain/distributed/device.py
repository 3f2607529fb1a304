"""The device a rank trains on, and how many CPU cores and threads it may use."""

from __future__ import annotations

import os

import torch

from scaletrain.distributed.rank import RankInfo
from scaletrain.errors import UserError

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


def testbed_cores(env: dict[str, str] | None = None) -> int | None:
    """The cores a testbed host gives its processes ($SCALETRAIN_CORES), or None off the testbed."""
    env = os.environ if env is None else env
    text = env.get(CORES_ENV, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def machine_cores(env: dict[str, str] | None = None) -> int:
    """Cores this node's ranks share: $SCALETRAIN_CORES when a testbed host sets it, else the affinity mask."""
    cores = testbed_cores(env)
    if cores is not None:
        return cores
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_threads_per_rank(local_world_size: int, requested: int | None = None) -> int:
    """Intra-op threads so that the local ranks share the cores instead of oversubscribing them."""
    if requested:
        return requested
    return max(1, machine_cores() // max(1, local_world_size))
