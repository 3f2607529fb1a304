"""The commbench worker: times each strategy's all-reduce at each size; rank 0 writes the rows.

`halo` is not an all-reduce: every rank swaps `size` bytes with each neighbour in a line of ranks (as spatial
tiles swap their border rows), after HALO_COMPUTE_S of computing alone (the same work on every rank), and the
time is the swap's alone, averaged over the ranks: what one exchange costs between ranks that compute between
exchanges, their skew included (on shared cores it is several times the idle latency: docs/commbench.md).

`fp16` and `bf16` time the all-reduce of `--compress fp16|bf16` as its DDP hook runs it on a `size`-byte float32
bucket: the compressor's encode (divide, cast), the all-reduce of the half-size payload, the decode and the copy back
into the bucket."""

from __future__ import annotations

from typing import Any

import time

import torch
import torch.distributed as dist

from scaletrain.comm.compress import make_compressor
from scaletrain.comm.ring import RingState
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
        # the ring as training runs it: each buffer handed to the hook's worker thread, waited on (comm/ring.py)
        ring = RingState(group=dist.new_group(), wrap_group=dist.new_group()) if "ring" in strategies else None
        try:
            rows = [_measure(s, size, seconds, device, ring) for s in strategies for size in sizes]
        finally:
            if ring is not None:
                ring.stop()
        if rank.rank == 0:
            append_jsonl(out, *rows)
        dist.barrier()
    finally:
        shutdown()


HALO_COMPUTE_S = 0.01
"""Compute between two halo swaps: a convolution layer's share of a tile's step at a few hundred pixels."""
HALO_ROUNDS = 30
"""Swaps timed at least, whatever --seconds says (each swap's wait is heavy-tailed; calibrate also takes the median
of several launches, whose latencies differ more than the rounds of one)."""


def _measure(strategy: str, size: int, seconds: float, device: torch.device, ring: RingState | None) -> dict[str, Any]:
    if strategy == "halo":
        return _measure_halo(size, seconds, device)
    world, rank = current_world_size(), current_rank()
    buf = torch.ones(size // 4, dtype=torch.float32, device=device)

    server = world - 1  # ps: the last rank serves, the others push and pull
    inbox = [torch.empty_like(buf) for _ in range(world - 1)] if strategy == "ps" and rank == server else []

    codec = make_compressor(strategy) if strategy in ("fp16", "bf16") else None

    def once() -> None:
        if strategy == "ring":
            ring.submit(buf).wait()
        elif strategy == "ps":
            _ps_round(buf, inbox, rank, server)
        elif codec is not None:  # as comm/hooks.compressed_hook: encode, all-reduce, decode; DDP copies it back
            payload = codec.encode(buf, 0, world)
            dist.all_reduce(payload[0])
            buf.copy_(codec.decode(payload, buf.numel(), world))
        else:
            dist.all_reduce(buf)

    for _ in range(2):  # warm-up: connections, allocations
        once()
    t = time_collective(once, 1, device)
    iters = max(3, min(200, int(seconds / max(t, 1e-6))))
    iters = int(largest(iters, device))  # every rank runs the same number of collectives
    cpu = time.process_time()
    elapsed = time_collective(once, iters, device)
    cpu = (time.process_time() - cpu) / iters  # the process's CPU per call: the engine's threads, the ring's
    elapsed, cpu = largest(elapsed, device), largest(cpu, device)
    if strategy == "ring":
        sent = ring_bytes(buf.numel(), 4, world, rank)
    elif strategy == "ps":  # one shard, no headers; the busiest rank is the server: (P-1) S
        n = buf.numel()
        sent = ps_server_bytes(n, world - 1, world - 1, header_bytes=0)[1] if rank == server else \
            ps_push_bytes([n], header_bytes=0)
    else:
        sent = allreduce_bytes(size // 2 if codec is not None else size, world)
    return {"strategy": strategy, "world": world, "size": size, "iters": int(iters), "time_s": elapsed,
            "cpu_s": cpu if device.type == "cpu" else None, "bytes_per_rank": largest(sent, device)}


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


def _measure_halo(size: int, seconds: float, device: torch.device) -> dict[str, Any]:
    world, rank = current_world_size(), current_rank()
    peers = [p for p in (rank - 1, rank + 1) if 0 <= p < world]
    sends = [torch.ones(size // 4, dtype=torch.float32, device=device) for _ in peers]
    receives = [torch.empty_like(t) for t in sends]
    work = _compute(HALO_COMPUTE_S, device)

    def swap() -> float:
        work()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        ops = [dist.P2POp(dist.isend, t, p) for p, t in zip(peers, sends)] + \
              [dist.P2POp(dist.irecv, t, p) for p, t in zip(peers, receives)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    for _ in range(2):  # warm-up: connections, allocations
        swap()
    # at least HALO_ROUNDS: one swap's wait is heavy-tailed (a rank descheduled now and then)
    iters = int(largest(max(HALO_ROUNDS, min(100, int(seconds / HALO_COMPUTE_S))), device))
    dist.barrier()
    mine = sum(swap() for _ in range(iters)) / iters
    total = torch.tensor([mine], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return {"strategy": "halo", "world": world, "size": size, "iters": iters, "time_s": float(total.item()) / world,
            "compute_s": HALO_COMPUTE_S, "bytes_per_rank": largest(size * len(peers), device)}


def _compute(seconds: float, device: torch.device):
    """A function that computes for about `seconds` on this device, the same work on every rank (the most
    repeats any rank needs)."""
    from scaletrain.perf.timing import median_time

    a = torch.randn(256, 256, device=device)

    def once() -> None:
        torch.mm(a, a)

    each = median_time(once, sync=torch.cuda.synchronize if device.type == "cuda" else None)
    repeats = int(largest(max(1, round(seconds / max(each, 1e-7))), device))

    def work() -> None:
        for _ in range(repeats):
            once()

    return work
