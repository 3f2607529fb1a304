"""A pipeline schedule's step, played op by op (docs/split.md). No torch.

Each stage runs its forwards (F) and backwards (B) of the M micro-batches in the order its schedule gives
(`torch.distributed.pipelining`'s, as comm/pipeline/strategy.py builds them), one op at a time; an op starts when its
stage is free and its input has arrived:

    F(s, i) after F(s-1, i)            (the activation from the stage before)
    B(s, i) after B(s+1, i)            (the gradient from the stage after; the last stage's after its own F)

    gpipe  every stage: F0 .. F(M-1), then B0 .. B(M-1)
    1f1b   stage s: min(M, K - s) forwards, then a backward and a forward in turn, then the backwards left

The step is the time the last op ends. It replaces the closed form `sum_s t_s + (M - 1) max_s t_s`, which
holds for stages of equal forward/backward shape but not when one stage is forward-heavy and the other
backward-heavy: at M = 2 it priced ResNet-20's uniform split (stages of 41.8 and 23.3 ms per micro-batch)
at 107 ms and the cut two blocks earlier at 106 ms; played out they take 88 and 106 ms, and measured 97
and 113 ms (docs/bench-pipeline.md).
"""

from __future__ import annotations

import functools

SCHEDULES = ("gpipe", "1f1b")


def order(schedule: str, stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The ops of `stage`, in the order it runs them: ("F" | "B", micro-batch)."""
    m = microbatches
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if schedule != "1f1b":
        raise ValueError(f"schedule {schedule!r}: one of {', '.join(SCHEDULES)}")
    warmup = min(m, stages - stage)
    ops = [("F", i) for i in range(warmup)]
    f, b = warmup, 0
    while b < m:
        ops.append(("B", b))
        b += 1
        if f < m:
            ops.append(("F", f))
            f += 1
    return ops


def step_time(forward: list[float], backward: list[float], schedule: str, microbatches: int) -> float:
    """Seconds from the first op to the last, stage s's forward op taking `forward[s]` and its backward op
    `backward[s]` (each with the messages it sends and receives). The ops are played in an order that meets every
    dependency (`_played`, the same for any durations: kept), each starting when its stage is free and its input
    has arrived (a plan's split search plays thousands of splits)."""
    k, m = len(forward), microbatches
    ends = [0.0] * (2 * k * m + 1)  # each op's end (_slots), and a last cell, 0, for the ops that wait on none
    free = [0.0] * k
    durations = [*forward, *backward]
    for s, slot, dep, duration in _slots(schedule, k, m):
        t, f = ends[dep], free[s]
        f = (f if f > t else t) + durations[duration]
        free[s] = ends[slot] = f
    return max(free)


@functools.lru_cache(maxsize=256)
def _slots(schedule: str, k: int, m: int) -> tuple[tuple[int, int, int, int], ...]:
    """`_played` as flat indices: (stage, the op's cell in step_time's `ends`, its input's cell (the last, always 0,
    for none), its duration's index in forward + backward)."""
    def cell(op: int, stage: int, i: int) -> int:
        return (op * k + stage) * m + i

    return tuple((s, cell(op, s, i), cell(dep_op, dep_stage, i) if dep_stage >= 0 else 2 * k * m, op * k + s)
                 for s, op, i, dep_op, dep_stage in _played(schedule, k, m))


@functools.lru_cache(maxsize=256)
def _played(schedule: str, k: int, m: int) -> tuple[tuple[int, int, int, int, int], ...]:
    """Every op as (stage, 0 forward | 1 backward, micro-batch, its input's op, its input's stage or -1 for none),
    in an order where each comes after its input and after the op before it on its stage: each stage runs its
    `order` as far as its inputs are done, in turn, until all have run."""
    plans = [order(schedule, s, k, m) for s in range(k)]
    done: set[tuple[str, int, int]] = set()
    nxt = [0] * k
    out = []
    while len(out) < sum(len(p) for p in plans):
        moved = False
        for s in range(k):
            while nxt[s] < len(plans[s]):
                kind, i = plans[s][nxt[s]]
                if kind == "F":
                    dep = ("F", s - 1, i) if s > 0 else None
                else:
                    dep = ("B", s + 1, i) if s < k - 1 else ("F", s, i)
                if dep is not None and dep not in done:
                    break
                done.add((kind, s, i))
                out.append((s, int(kind == "B"), i, int(dep is not None and dep[0] == "B"),
                            dep[1] if dep is not None else -1))
                nxt[s] += 1
                moved = True
        if not moved:  # a schedule whose ops wait on each other: a bug in `order`
            raise RuntimeError(f"{schedule} schedule deadlocks at {nxt}")
    return tuple(out)


def lower_bound(forward: list[float], backward: list[float], microbatches: int) -> float:
    """A bound no schedule beats, over the stages given so far (the first ones of a pipeline): stage s cannot
    start before one micro-batch's forwards through the stages before it, runs its M forwards and M
    backwards, and its last gradient still has to go back through those stages."""
    ahead = NOTHING_AHEAD
    for f, b in zip(forward, backward):
        ahead = with_stage(ahead, f, b, microbatches)
    return ahead[0]


NOTHING_AHEAD = (0.0, 0.0, 0.0)  # (lower_bound, sum of forwards, sum of backwards) of no stage


def with_stage(ahead: tuple[float, float, float], f: float, b: float, microbatches: int) -> tuple[float, float, float]:
    """`ahead` (lower_bound over some first stages, their forward and backward sums) with the next stage's forward
    `f` and backward `b` added: a split's search extends it a stage at a time."""
    bound, ahead_f, ahead_b = ahead
    return max(bound, ahead_f + microbatches * (f + b) + ahead_b), ahead_f + f, ahead_b + b
