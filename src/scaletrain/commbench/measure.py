"""The commbench worker: times each strategy's all-reduce at each size; rank 0 writes the rows."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from scaletrain.comm.ring import ring_allreduce_
from scaletrain.distributed.rank import RankInfo
from scaletrain.distributed.device import choose_device, cpu_threads_per_rank
from scaletrain.distributed.group import (current_rank, current_world_size, init_process_group, largest, shutdown,
                                          time_collective)
from scaletrain.perf.wire import allreduce_bytes, ps_push_bytes, ps_server_bytes, ring_bytes
from scaletrain.rundir import append_jsonl


def worker_main(strategies: list[str], sizes: list[int], seconds: float, out: str) -> None:
    """Entry point the elastic agent starts on every rank."""
    rank = RankInfo.from_env()
    device = choose_device("auto", rank)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads_per_rank(rank.local_world_size, None))
    init_process_group(device, rank)
    try:
        ring_groups = (dist.new_group(), dist.new_group()) if "ring" in strategies else (None, None)
        rows = [_measure(s, size, seconds, device, ring_groups) for s in strategies for size in sizes]
        if rank.rank == 0:
            append_jsonl(out, *rows)
        dist.barrier()
    finally:
        shutdown()


def _measure(strategy: str, size: int, seconds: float, device: torch.device, ring_groups: Any) -> dict[str, Any]:
    world, rank = current_world_size(), current_rank()
    buf = torch.ones(size // 4, dtype=torch.float32, device=device)

    server = world - 1  # ps: the last rank serves, the others push and pull
    inbox = [torch.empty_like(buf) for _ in range(world - 1)] if strategy == "ps" and rank == server else []

    def once() -> None:
        if strategy == "ring":
            ring_allreduce_(buf, *ring_groups)
        elif strategy == "ps":
            _ps_round(buf, inbox, rank, server)
        else:
            dist.all_reduce(buf)

    for _ in range(2):  # warm-up: connections, allocations
        once()
    t = time_collective(once, 1, device)
    iters = max(3, min(200, int(seconds / max(t, 1e-6))))
    iters = int(largest(iters, device))  # every rank runs the same number of collectives
    elapsed = largest(time_collective(once, iters, device), device)
    if strategy == "ring":
        sent = ring_bytes(buf.numel(), 4, world, rank)
    elif strategy == "ps":  # one shard, no headers; the busiest rank is the server: (P-1) S
        n = buf.numel()
        sent = ps_server_bytes(n, world - 1, world - 1, header_bytes=0)[1] if rank == server else \
            ps_push_bytes([n], header_bytes=0)
    else:
        sent = allreduce_bytes(size, world)
    return {"strategy": strategy, "world": world, "size": size,
            "iters": int(iters), "time_s": elapsed, "bytes_per_rank": largest(sent, device)}


def _ps_round(buf: torch.Tensor, inbox: list[torch.Tensor], rank: int, server: int) -> None:
    """One synchronous parameter-server exchange: every worker pushes, the server sums and sends back."""
    if rank != server:
        dist.send(buf, server)
        dist.recv(buf, server)
        return
    for work in [dist.irecv(t, src=w) for w, t in enumerate(inbox)]:
        work.wait()
    total = torch.stack(inbox).sum(0)
    for work in [dist.isend(total, dst=w) for w in range(len(inbox))]:
        work.wait()
