"""The process group: set up, torn down, and the few collectives the trainer itself uses."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from scaletrain.distributed.rank import RankInfo

def init_process_group(device: torch.device, rank: RankInfo, timeout_s: float = 300) -> str:
    """NCCL for CUDA, gloo for CPU; returns the backend name."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if rank.world_size > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, rank=rank.rank, world_size=rank.world_size,
                                timeout=timedelta(seconds=timeout_s), store=attempt_store(timeout_s),
                                device_id=device if device.type == "cuda" else None)
    return backend


def attempt_store(timeout_s: float):
    """Under the elastic agent, the workers meet in the agent's own store, which outlives a restart: the
    keys a failed attempt's ranks left there (their addresses, barrier counts) would be read by the next
    attempt's as their own: gloo connects to a dead rank's port ("Connection refused") or a barrier never
    fills. Each attempt gets its own key space in it. None (env://) where no agent's store is shared."""
    from scaletrain.distributed.env import agent_store

    where = agent_store()
    if where is None:
        return None
    host, port, attempt = where
    base = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    return dist.PrefixStore(f"scaletrain/attempt{attempt}/", base)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks in place (no-op in a single process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """The largest value over ranks, in place (no-op in a single process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
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
        # gloo's worker threads may still be freeing the last collective's tensors, which needs the GIL
        # that destroy_process_group holds while it waits for them: seen hanging about 1 in 30 times in
        # back-to-back in-process runs (torch 2.13). A moment's pause lets them finish first.
        time.sleep(0.05)
        dist.destroy_process_group()


@contextlib.contextmanager
def alone(device: torch.device):
    """A process group of this process alone (an in-memory store) while the block runs: what timing a distributed
    tensor's work in one process needs (calibrate times FSDP's sharded optimizer so). A group already up is used."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        shutdown()


def current_rank(group=None) -> int:
    """This process's rank in `group` (the default group), 0 without a process group."""
    return dist.get_rank(group) if dist.is_initialized() else 0


def current_world_size(group=None) -> int:
    """Processes in `group` (the default group), 1 without a process group."""
    return dist.get_world_size(group) if dist.is_initialized() else 1


def block_groups(size: int, blocks: int, rank: int):
    """The world as `blocks` blocks of `size` consecutive ranks (a pipeline's stages, one image's tiles): (the
    group of this rank's block, the group of the ranks at its place in every block), or (None, None) when there
    is one block (the default group is it). Collective: every rank creates every group, in the same order."""
    if blocks == 1:
        return None, None
    mine = across = None
    for i in range(blocks):
        g = dist.new_group(list(range(i * size, (i + 1) * size)))
        if i == rank // size:
            mine = g
    for j in range(size):
        g = dist.new_group(list(range(j, size * blocks, size)))
        if j == rank % size:
            across = g
    return mine, across


def mesh_groups(shape: tuple[int, ...], rank: int) -> list:
    """The world as a row-major mesh of `shape` (the last dimension's ranks consecutive): for each dimension, the
    group of the ranks that differ from this rank in that dimension alone (None where the dimension has size 1).
    Collective: every rank creates every group, in the same order."""
    import itertools
    import math

    assert math.prod(shape) == dist.get_world_size(), (shape, dist.get_world_size())
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    mine: list = [None] * len(shape)
    for d, size in enumerate(shape):
        if size == 1:
            continue
        others = [range(n) if e != d else range(1) for e, n in enumerate(shape)]
        for base in itertools.product(*others):
            start = sum(i * st for i, st in zip(base, strides))
            ranks = [start + i * strides[d] for i in range(size)]
            g = dist.new_group(ranks)
            if rank in ranks:
                mine[d] = g
    return mine


def all_reduce_flat(tensors: list[torch.Tensor], group=None, divide: int = 1) -> None:
    """Sum `tensors` over `group` in one message (flattened), divided by `divide`, written back in place."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    if divide != 1:
        flat /= divide
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def broadcast_buffers(model: torch.nn.Module) -> None:
    """Broadcast rank 0's buffers (BN running statistics), which DDP only syncs at the next forward."""
    if current_world_size() > 1:
        for buf in model.buffers():
            dist.broadcast(buf, src=0)


def broadcast_object(obj):
    """Rank 0's `obj` on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def largest(value: float, device: torch.device) -> float:
    """The largest of every rank's `value` (collective): a collective's time is its slowest rank's."""
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def time_collective(fn: Callable[[], object], iters: int, device: torch.device) -> float:
    """Seconds per call of the collective `fn`, run `iters` times back to back from a barrier (a CUDA device
    synchronised once, at the end, so the time covers the kernels), on this rank; `largest` makes it the
    slowest rank's. The one way an exchange is timed (commbench, the all-reduce's bucket sweep)."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def time_allreduce(nbytes: int, device: torch.device, iters: int = 3) -> float:
    """Seconds of one all-reduce of `nbytes` on the default group (after a warm-up), the slowest rank's."""
    buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
    dist.all_reduce(buf)
    return largest(time_collective(lambda: dist.all_reduce(buf), iters, device), device)
