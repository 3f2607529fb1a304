"""`--split auto`'s last word: the split the cost model chose and its neighbours (each cut moved one block
either way) timed for a few steps in the pipeline itself, before training; the fastest is kept.

Why: the model prices blocks one at a time, and a stage inside a running pipeline is not the sum of its blocks
timed alone. Measured here (docs/bench-pipeline.md): ResNet-20's last stage carried 6-9 ms per step more than
its blocks, and the calibrated laws priced VGG-11's fully connected stage 0.78x of its time: each moved the
chosen cut one block from the fastest. Where the neighbours are near-equal the choice costs little either way; where the model is off
systematically, timing them in place corrects it.

    candidates   the chosen bounds, then every split with one cut moved by one block (2 (K-1) at most)
    rounds       --split-trials R: each round times every candidate for STEPS steps, the order rotated
    a step       the schedule's forward and backward over the micro-batches of a random batch, on copies
                 of the model's blocks (its weights, BatchNorm statistics and the RNG are left as they were)
    time         rank 0's wall time between two barriers of its pipeline, per step
    the choice   the model's, unless a neighbour was faster than it in every round: then, of those, the one
                 with the least median. Neighbours differ by a few percent and a round here by 6-12%, so a
                 lower median alone would move the cut by noise as often as by cause (seen in
                 docs/bench-pipeline.md); faster in all of 5 rounds happens by chance once in 32.

Collective over the whole job: every rank times its stage of every candidate; rank 0's choice is everyone's.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from scaletrain.dist.group import broadcast_object
from scaletrain.split.stages import Blocked, Bounds, stage_module

STEPS = 2  # timed steps per candidate per round (after one untimed step that sets up the schedule's buffers)


def neighbours(bounds: Bounds, blocks: int) -> list[Bounds]:
    """`bounds`, then every split of `blocks` blocks with one of its cuts moved by one block."""
    cuts = [hi for _, hi in bounds[:-1]]
    out = [list(bounds)]
    for i in range(len(cuts)):
        for step in (-1, 1):
            moved = cuts[:i] + [cuts[i] + step] + cuts[i + 1:]
            edges = [0, *moved, blocks]
            candidate = list(zip(edges, edges[1:]))
            if all(lo < hi for lo, hi in candidate) and candidate not in out:
                out.append(candidate)
    return out


def try_splits(pipe, graph: Blocked, bounds: Bounds, sample_shape: tuple[int, ...],
               rounds: int) -> tuple[Bounds, list[dict[str, Any]]]:
    """(the fastest of `bounds` and its neighbours in this pipeline, each candidate's bounds and median step
    seconds). `pipe`: the rank's Pipeline strategy (its stage, groups, device and settings)."""
    from scaletrain.comm.pipeline import build_schedule, stage_wrapper

    cfg, device = pipe.cfg, pipe.device
    candidates = neighbours(bounds, len(graph.blocks))
    copied = Blocked(dataclasses.replace(graph.graph, traced=copy.deepcopy(graph.graph.traced)), graph.blocks)
    micro = cfg.batch_size // cfg.microbatches
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.batch_size, *sample_shape, generator=gen).to(device)
    y = torch.randint(0, graph.blocks[-1].out_shape[-1], (cfg.batch_size,), generator=gen).to(device)
    times: list[list[float]] = [[] for _ in candidates]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        runs = []
        for cand in candidates:
            lo, hi = cand[pipe.stage]
            module = stage_wrapper(stage_module(copied, lo, hi).to(device).train(), cfg, device)
            in_shape = (micro, *sample_shape) if lo == 0 else graph.blocks[lo - 1].out_shape
            _, schedule = build_schedule(module, pipe.stage, pipe.stages, device, in_shape,
                                         graph.blocks[hi - 1].out_shape, cfg.pipeline_schedule, cfg.microbatches,
                                         pipe.pp_group)
            runs.append((module, schedule))
            _step(pipe, module, schedule, x, y)  # sets up the schedule's buffers: not timed
        for r in range(rounds):
            order = list(range(len(candidates)))
            for i in order[r % len(order):] + order[:r % len(order)]:
                module, schedule = runs[i]
                dist.barrier(group=pipe.pp_group)
                t0 = time.perf_counter()
                for _ in range(STEPS):
                    _step(pipe, module, schedule, x, y)
                dist.barrier(group=pipe.pp_group)
                times[i].append((time.perf_counter() - t0) / STEPS)
    times = broadcast_object(times)  # rank 0's timings decide, for every replica alike
    best, wins = pick(times)
    trials = [{"bounds": [list(b) for b in cand], "step_s": statistics.median(t), "rounds_faster": w,
               "chosen": i == best} for i, (cand, t, w) in enumerate(zip(candidates, times, wins))]
    return [tuple(b) for b in candidates[best]], trials


def pick(times: list[list[float]]) -> tuple[int, list[int | None]]:
    """(the index kept, each neighbour's count of rounds faster than candidate 0): candidate 0 (the model's
    choice) unless some neighbour was faster than it in every round; then the least median of those."""
    wins: list[int | None] = [None] + [sum(a < b for a, b in zip(t, times[0])) for t in times[1:]]
    better = [i for i in range(1, len(times)) if wins[i] == len(times[0])]
    return (min(better, key=lambda i: statistics.median(times[i])) if better else 0), wins


def _step(pipe, module, schedule, x: torch.Tensor, y: torch.Tensor) -> None:
    module.zero_grad(set_to_none=True)
    if pipe.stage == 0:
        schedule.step(x, return_outputs=False)
    elif pipe.is_last:
        schedule.step(target=y, losses=[], return_outputs=False)
    else:
        schedule.step(return_outputs=False)
