"""The point-to-point link between pipeline neighbours, measured where the job runs: what a pipeline chooses its
split with (comm/pipeline/strategy.py), in place of a guess that fits no machine (10 Gbit/s is 30x too slow for
NVLink and makes the split keep the early, large activations in one stage).

Each pair (sender, receiver) times a round trip of a 4-byte message and of `nbytes` (the receiver answers each with
4 bytes): latency = the small round trip / 2, bandwidth = nbytes / (large - small round trip), medians over the
rounds. Pairs that share no rank run at once (even links, then odd: as a running pipeline's stages send); the link
reported is the slowest pair's (the largest latency, the least bandwidth).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from scaletrain.distributed.group import gather_objects


def measure_links(chain: list[int], me: int, device: torch.device, nbytes: int, rounds: int = 3
                  ) -> dict[str, Any] | None:
    """Collective over the default group (every rank calls it): the link between consecutive ranks of `chain` (a
    replica's stages in order), as {"latency_s", "bytes_per_s", "bytes", "pairs"}, the same on every rank; None with
    fewer than two ranks in the chain."""
    if len(chain) < 2:
        return None
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    small = torch.zeros(1, device=device)
    large = torch.zeros(max(1, nbytes // 4), device=device)
    mine = None
    for parity in (0, 1):
        for i in range(parity, len(chain) - 1, 2):
            sender, receiver = chain[i], chain[i + 1]
            if me == sender:
                mine = _time_pair(receiver, small, large, rounds, sync)
            elif me == receiver:
                _answer_pair(sender, small, large, rounds)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # the odd pairs start when the even ones have ended
    every = [m for m in gather_objects(mine) if m is not None]
    return {"latency_s": max(m[0] for m in every), "bytes_per_s": min(m[1] for m in every), "bytes": large.numel() * 4,
            "pairs": len(every)}


def _time_pair(peer: int, small: torch.Tensor, large: torch.Tensor, rounds: int, sync) -> tuple[float, float]:
    trips = {"small": [], "large": []}
    for r in range(rounds + 1):  # the first round warms the connection up, untimed
        for kind, t in (("small", small), ("large", large)):
            sync()
            start = time.perf_counter()
            dist.send(t, peer)
            dist.recv(small, peer)
            sync()
            if r:
                trips[kind].append(time.perf_counter() - start)
    rt_small, rt_large = statistics.median(trips["small"]), statistics.median(trips["large"])
    return rt_small / 2, large.numel() * 4 / max(rt_large - rt_small, 1e-9)


def _answer_pair(peer: int, small: torch.Tensor, large: torch.Tensor, rounds: int) -> None:
    for _ in range(rounds + 1):
        for t in (small, large):
            dist.recv(t, peer)
            dist.send(small, peer)
