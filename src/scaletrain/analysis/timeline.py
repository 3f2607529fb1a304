"""A step's phases from its recorded intervals (pure functions; see docs/metrics.md for the definitions).

One step on one rank, as recorded (times in seconds from the step's start):

    |data_wait|h2d|forward |backward compute      |comm_exposed|optimizer|other|
                           |   [bucket 1 comm]    |            |
                           |            [bucket 2 comm      ]  |
                                                  ^ last bucket ready = backward compute done

The spans tile the step, so the phases add up to the step time exactly. The `backward` span as
recorded lasts until `loss.backward()` returns, which DDP delays until every bucket is reduced; it is
split at the moment the last bucket became ready: before it is backward compute, after it is exposed
communication. Communication that overlaps forward, backward compute or optimizer is hidden.
"""

from __future__ import annotations

from typing import Iterable, Sequence

PHASES = ("data_wait", "h2d", "forward", "backward", "comm_exposed", "optimizer", "other")
COMPUTE = ("forward", "backward", "optimizer")
# a pipeline stage's steps have two more (docs/metrics.md): `bubble`, blocked waiting to receive an
# activation or a gradient from a neighbouring stage, and `p2p`, posting sends and receives and waiting
# for sends alone to complete. Recorded only by pipeline runs; every other run's records lack them.
PIPELINE_PHASES = ("bubble", "p2p")
# spatial tiles' steps (docs/metrics.md): `halo`, exchanging the tiles' borders (and, in backward, their
# gradients) inside forward and backward; `gather`, assembling the tiles' outputs into the whole image
SPATIAL_PHASES = ("halo", "gather")
STRATEGY_PHASES = (PIPELINE_PHASES, SPATIAL_PHASES)


def phase_names(phases: dict[str, float] | None = None) -> tuple[str, ...]:
    """PHASES in step order, with a strategy's own (the pipeline's two, the tiles' two) before `other` when
    `phases` has them."""
    own = tuple(p for group in STRATEGY_PHASES if phases is not None and any(k in phases for k in group)
                for p in group)
    return PHASES[:-1] + own + PHASES[-1:]

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge overlapping intervals into disjoint, sorted ones (empty ones dropped)."""
    merged: list[list[float]] = []
    for lo, hi in sorted((a, b) for a, b in intervals if b > a):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def length(intervals: Iterable[Interval]) -> float:
    """Total time covered by a set of possibly overlapping intervals."""
    return sum(hi - lo for lo, hi in union(intervals))


def overlap(a: Iterable[Interval], b: Iterable[Interval]) -> float:
    """Time covered by both a and b."""
    ua, ub = union(a), union(b)
    total = 0.0
    for lo, hi in ua:
        for blo, bhi in ub:
            total += max(0.0, min(hi, bhi) - max(lo, blo))
    return total


def step_phases(spans: Sequence[tuple[str, float, float]], buckets: Sequence[tuple[float, float]]) -> dict:
    """Phases, total/hidden communication and overlap ratio of one step.

    spans: (name, begin, end) tiling the step; name is a phase of PHASES (`backward` spans include the
    wait for the reductions; a `comm_exposed` span is communication outside backward, e.g. a parameter
    server's push and pull, which is also one of the `buckets`). buckets: (ready, done) of each gradient
    bucket's reduction, ready being when the hook was called.
    """
    phases = dict.fromkeys(PHASES, 0.0)
    compute: list[Interval] = []
    for name, begin, end in spans:
        if name == "backward":
            ready = [r for r, _ in buckets if begin <= r <= end]
            split = max(ready) if ready else end
            phases["backward"] += split - begin
            phases["comm_exposed"] += end - split
            compute.append((begin, split))
        else:
            phases[name] = phases.get(name, 0.0) + end - begin
            if name in COMPUTE:
                compute.append((begin, end))
    comm = [(r, d) for r, d in buckets]
    total = length(comm)
    hidden = overlap(comm, compute)
    return {"phases_s": phases, "comm_total_s": total, "comm_hidden_s": hidden,
            "overlap_ratio": hidden / total if total > 0 else None}


def step_cpu(spans: Sequence[tuple[str, float, float, float, float]],
             readies: Sequence[tuple[float, float | None]]) -> dict[str, float]:
    """CPU seconds of the process (all its threads) in each phase of one step, split like step_phases.

    spans: (name, begin, end, cpu_begin, cpu_end), wall marks as in step_phases and the process CPU
    clock read at the same marks. readies: (ready, cpu_at_ready) of each bucket, the CPU clock read when
    the hook was called; a `backward` span is split at the last bucket ready in it, as its wall time is.
    """
    cpu = dict.fromkeys(PHASES, 0.0)
    for name, begin, end, cpu_begin, cpu_end in spans:
        inside = [(r, c) for r, c in readies if begin <= r <= end and c is not None] if name == "backward" else []
        if inside:
            split = min(max(max(inside)[1], cpu_begin), cpu_end)
            cpu["backward"] += split - cpu_begin
            cpu["comm_exposed"] += cpu_end - split
        else:
            cpu[name] = cpu.get(name, 0.0) + cpu_end - cpu_begin
    return cpu
