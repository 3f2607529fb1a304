"""Splitting a model's block sequence into K contiguous pipeline stages, exactly (docs/split.md). No torch.

Each block's cost is given per micro-batch (`BlockCost`). Stage s of K (0-based) holding blocks i..j-1:

    time_s     = forward + backward of its blocks
                 + transfer: per micro-batch it receives its input activation and sends that gradient back
                   (when s > 0) and sends its output activation and receives that gradient (when s < K-1),
                   each message latency + bytes / link rate (a blocking send, as gloo's, occupies both ends)
                 + activation offload copies, when it offloads them (out after forward, back before backward)
    memory_s   = the memory model's stage (`memory`: comm/pipeline/memory.py, the one the pre-flight check and
                 `predict` read), part by part: weights, gradients, optimizer state; `activations`, what the
                 micro-batches in flight before the one in backward hold; `working`, that one at its peak.
                 in flight: gpipe M (every forward runs before the first backward); 1f1b min(M, K - s)
                 Without it (a model the meta device cannot run) the blocks' bytes stand in: parameter bytes x
                 (2 + optimizer state copies), (in flight - 1) x (saved + input) and, working, saved + input
                 + one gradient buffer of its input and one of its output.

The predicted step time, for M micro-batches: the schedule played op by op (split/schedule.py), stage s's
forward op taking its forward + half its transfers and offload copies, its backward op the other half, plus
max_s update_s (the copies of an offloaded optimizer, below, once per step; the optimizer step itself is
left out). For stages of equal shape that is the closed form sum_s time_s + (M - 1) x max_s time_s (equal
stages: GPipe's (M + K - 1) x time); for a forward-heavy stage beside a backward-heavy one it is less, and the
closed form ranked splits wrongly at small M (docs/split.md).

`optimal` finds the split with the smallest predicted step (ties: the smaller bottleneck max_s time_s) among
those whose stages fit the memory limit, exactly: a branch and bound over the cuts, stage by stage, that drops
a partial split once schedule.lower_bound of its stages (and, between the same fill and drain, the least
bottleneck the blocks left can be cut into, M times, or one micro-batch's way through them and back) reaches the
best step found, starting from the split with the least bottleneck (a dynamic programme
over (stages, prefix), O(K n^2), then the least sum of stage times among those). With an offload rate
(`offload_bytes_per_s`) a stage that does not fit may keep in pinned host memory, cheapest first: its
optimizer state (as ZeRO-Offload: each step the gradients go out and the updated weights come back, 2 x
parameter bytes; the micro-batch time is unchanged) and then the activations of its in-flight micro-batches
but the one being computed (out and back: 2 x one micro-batch's share of `activations`, added to its time).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from scaletrain import fmt
from scaletrain.errors import UserError
from scaletrain.split import schedule as play

Bounds = list[tuple[int, int]]  # per stage: (first block, one past its last block), as split/stages.py
StageMemory = Callable[[int, int, int], dict[str, int]]
"""Stage s over blocks i..j-1, part by part: weights, gradients, optimizer, activations (the micro-batches in flight
before the one computed, offloadable), working (comm/pipeline/memory.py)."""
SCHEDULES = ("gpipe", "1f1b")
OFFLOADS = ("none", "optimizer", "activations", "optimizer+activations")  # cheapest first


@dataclass(frozen=True)
class BlockCost:
    """One block's cost per micro-batch."""

    name: str
    forward_s: float
    backward_s: float
    param_bytes: int
    saved_bytes: int  # activations kept for backward
    out_bytes: int  # the tensor crossing the cut after it (its gradient comes back the same size)


@dataclass
class Partition:
    """A split, priced: `stages` as dicts (first, last, blocks, forward_s, backward_s, transfer_s, offload_s,
    time_s, update_s, memory_bytes, memory, offload, fits)."""

    method: str
    bounds: Bounds
    stages: list[dict[str, Any]]
    bottleneck: int  # index of the slowest stage
    step_s: float
    microbatches: int
    schedule: str
    memory_limit: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def bottleneck_s(self) -> float:
        return self.stages[self.bottleneck]["time_s"]

    @property
    def peak_memory(self) -> int:
        return max(s["memory_bytes"] for s in self.stages)

    @property
    def fits(self) -> bool:
        return all(s["fits"] for s in self.stages)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "bounds": [list(b) for b in self.bounds],
                "sizes": [hi - lo for lo, hi in self.bounds], "stages": self.stages, "bottleneck": self.bottleneck,
                "bottleneck_s": self.bottleneck_s, "step_s": self.step_s, "peak_memory_bytes": self.peak_memory,
                "fits": self.fits, "notes": self.notes}


class Infeasible(UserError):
    """No split into K stages fits the memory limit; `smallest` is the least limit that has one."""

    def __init__(self, message: str, smallest: int) -> None:
        super().__init__(message)
        self.smallest = smallest


@dataclass(frozen=True)
class _Stage:
    forward_s: float
    backward_s: float
    transfer_s: float
    offload_s: float
    update_s: float
    held: dict[str, int] | Callable[[], dict[str, int]]  # its memory, or what gives it when first asked
    offload: str

    @property
    def time_s(self) -> float:
        return self.forward_s + self.backward_s + self.transfer_s + self.offload_s

    @functools.cached_property
    def memory(self) -> dict[str, int]:  # (a search without a limit asks it of the chosen split's stages alone)
        return self.held if isinstance(self.held, dict) else self.held()

    @property
    def memory_bytes(self) -> int:
        return sum(self.memory.values())


class _Model:
    """The cost model above over one cost vector, with prefix sums: a stage's figures in O(1)."""

    def __init__(self, costs: list[BlockCost], stages: int, *, microbatches: int, schedule: str,
                 link_bytes_per_s: float, latency_s: float, state_copies: int, memory_limit: int | None,
                 offload_bytes_per_s: float | None, memory: StageMemory | None = None) -> None:
        if not costs:
            raise UserError("the model has no blocks to split")
        if stages < 1:
            raise UserError(f"--stages {stages}: a pipeline needs at least 1 stage")
        if stages > len(costs):
            raise UserError(f"--stages {stages} is more than the model's {len(costs)} blocks "
                            f"({len(costs) - 1} cut points): use --stages {len(costs)} or fewer")
        if schedule not in SCHEDULES:
            raise UserError(f"schedule {schedule!r}: use one of {', '.join(SCHEDULES)}")
        if microbatches < 1:
            raise UserError(f"--microbatches {microbatches}: give at least 1")
        if not link_bytes_per_s > 0:
            raise UserError(f"link rate {link_bytes_per_s} bytes/s must be positive")
        if memory_limit is not None and memory_limit <= 0:
            raise UserError(f"memory limit {memory_limit} bytes must be positive")
        self.costs, self.n, self.k = costs, len(costs), stages
        self.m, self.schedule = microbatches, schedule
        self.rate, self.latency, self.state_copies = link_bytes_per_s, latency_s, state_copies
        self.limit, self.host_rate = memory_limit, offload_bytes_per_s
        self.memory_of = memory  # the memory model's stage s over blocks i..j-1; None: the blocks' bytes

        def prefix(values: list[float]) -> list[float]:
            return list(itertools.accumulate(values, initial=0))

        self.fwd = prefix([c.forward_s for c in costs])
        self.bwd = prefix([c.backward_s for c in costs])
        self.par = prefix([c.param_bytes for c in costs])
        self.saved = prefix([c.saved_bytes for c in costs])
        self._stages: dict[tuple[int, int, int], _Stage] = {}  # the programmes ask for each stage several times

    def _message(self, nbytes: int) -> float:
        return self.latency + nbytes / self.rate

    def in_flight(self, s: int) -> int:
        return self.m if self.schedule == "gpipe" else min(self.m, self.k - s)

    def stage(self, s: int, i: int, j: int) -> _Stage:
        """Stage s over blocks i..j-1: without offload when it fits (or no limit), else the cheapest offload
        that fits, else (nothing fits) without offload."""
        key = (s, i, j)
        if key not in self._stages:
            options = [self._priced(s, i, j, o) for o in self._offloads(s)]
            fitting = [o for o in options if self.limit is None or o.memory_bytes <= self.limit]
            self._stages[key] = (fitting or options)[0]
        return self._stages[key]

    def smallest_memory(self, s: int, i: int, j: int) -> int:
        return min(self._priced(s, i, j, o).memory_bytes for o in self._offloads(s))

    def _offloads(self, s: int) -> tuple[str, ...]:
        """What stage s may offload: nothing without a host rate; activations only with more than one
        micro-batch in flight (the one being computed stays)."""
        if not self.host_rate:
            return OFFLOADS[:1]
        return OFFLOADS if self.in_flight(s) > 1 else OFFLOADS[:2]

    def fits(self, st: _Stage) -> bool:
        return self.limit is None or st.memory_bytes <= self.limit

    def time_s(self, s: int, i: int, j: int) -> float:
        """stage(s, i, j).time_s; without a limit (no stage offloads) from the prefix sums alone, no stage made."""
        if self.limit is not None:
            return self.stage(s, i, j).time_s
        return self.fwd[j] - self.fwd[i] + (self.bwd[j] - self.bwd[i]) + self._transfer(i, j) + 0.0

    def halves(self, s: int, i: int, j: int) -> tuple[float, float, float] | None:
        """Stage s over blocks i..j-1 as the schedule plays it: its forward and backward ops (`ops`) and its update_s;
        None where it does not fit. Without a limit from the prefix sums alone, no stage made."""
        if self.limit is None:
            half = (self._transfer(i, j) + 0.0) / 2
            return self.fwd[j] - self.fwd[i] + half, self.bwd[j] - self.bwd[i] + half, 0.0
        st = self.stage(s, i, j)
        if not self.fits(st):
            return None
        (f,), (b,) = self.ops([st])
        return f, b, st.update_s

    def _transfer(self, i: int, j: int) -> float:
        into = self.costs[i - 1].out_bytes if i > 0 else 0  # the model's input itself is not counted
        out = self.costs[j - 1].out_bytes if j < self.n else 0
        return (2 * self._message(into) if i > 0 else 0.0) + (2 * self._message(out) if j < self.n else 0.0)

    def _priced(self, s: int, i: int, j: int, offload: str) -> _Stage:
        into = self.costs[i - 1].out_bytes if i > 0 else 0  # the model's input itself is not counted
        out = self.costs[j - 1].out_bytes if j < self.n else 0
        transfer = self._transfer(i, j)
        params = self.par[j] - self.par[i]

        def held() -> dict[str, int]:
            memory = dict(self.memory_of(s, i, j)) if self.memory_of is not None else \
                self._block_bytes(s, i, j, into, out)
            if "activations" in offload:
                memory["activations"] = 0
            if "optimizer" in offload:
                memory["optimizer"] = 0
            return {k: int(v) for k, v in memory.items()}

        offload_s, update_s = 0.0, 0.0
        if "activations" in offload:  # (offered only with more than one micro-batch in flight)
            kept = self.memory_of(s, i, j)["activations"] if self.memory_of is not None else \
                self._block_bytes(s, i, j, into, out)["activations"]
            offload_s = 2 * kept / (self.in_flight(s) - 1) / self.host_rate
        if "optimizer" in offload:
            update_s = 2 * params / self.host_rate
        # without a limit no stage's memory chooses anything: it is worked out for the stages asked for it
        return _Stage(self.fwd[j] - self.fwd[i], self.bwd[j] - self.bwd[i], transfer, offload_s, update_s,
                      held if self.limit is None else held(), offload)

    def _block_bytes(self, s: int, i: int, j: int, into: int, out: int) -> dict[str, int]:
        """Stage s's memory from the blocks' bytes alone, when no memory model is given (module docstring)."""
        params = self.par[j] - self.par[i]
        kept = self.saved[j] - self.saved[i] + into
        return {"weights": params, "gradients": params, "optimizer": params * self.state_copies,
                "activations": (self.in_flight(s) - 1) * kept, "working": kept + into + out}

    def partition(self, method: str, bounds: Bounds, notes: list[str] | None = None) -> Partition:
        stages = [self.stage(s, lo, hi) for s, (lo, hi) in enumerate(bounds)]
        times = [st.time_s for st in stages]
        worst = max(range(len(times)), key=lambda s: times[s])
        step = self.step(stages)
        rows = [{"first": lo, "last": hi - 1, "blocks": [c.name for c in self.costs[lo:hi]],
                 "forward_s": st.forward_s, "backward_s": st.backward_s, "transfer_s": st.transfer_s,
                 "offload_s": st.offload_s, "time_s": st.time_s, "update_s": st.update_s,
                 "memory_bytes": st.memory_bytes, "memory": st.memory, "offload": st.offload,
                 "in_flight": self.in_flight(s), "fits": self.fits(st)}
                for s, ((lo, hi), st) in enumerate(zip(bounds, stages))]
        return Partition(method, [tuple(b) for b in bounds], rows, worst, step, self.m, self.schedule, self.limit,
                         list(notes or []))

    def step(self, stages: list[_Stage]) -> float:
        """The predicted step of these stages (all K of them): the schedule played out, plus the update."""
        fwd, bwd = self.ops(stages)
        return play.step_time(fwd, bwd, self.schedule, self.m) + max(st.update_s for st in stages)

    @staticmethod
    def ops(stages: list[_Stage]) -> tuple[list[float], list[float]]:
        """Each stage's forward and backward op, per micro-batch: compute, and half its messages and copies each."""
        fwd = [st.forward_s + (st.transfer_s + st.offload_s) / 2 for st in stages]
        bwd = [st.backward_s + (st.transfer_s + st.offload_s) / 2 for st in stages]
        return fwd, bwd

    def infeasible(self) -> Infeasible:
        smallest, _ = _solve(self.n, self.k, self.smallest_memory, max)
        return _infeasible(self, int(smallest))


def _infeasible(model: _Model, smallest: int) -> Infeasible:
    offload = " even with offload" if model.host_rate else ""
    hint = " or --offload" if not model.host_rate else ""
    return Infeasible(
        f"no split into {model.k} stages fits {fmt.size(model.limit)} per stage{offload} ({model.schedule}, "
        f"{model.m} micro-batches): the smallest limit with a feasible split is {smallest} bytes "
        f"({fmt.size(smallest, up=True)}); raise the limit to that, use more stages, fewer micro-batches{hint}",
        smallest)


def _solve(n: int, k: int, value: Callable[[int, int, int], float], combine: Callable[[float, float], float],
           allowed: Callable[[int, int, int], bool] | None = None) -> tuple[float, Bounds | None]:
    """The split of 0..n into k non-empty contiguous stages minimising combine-folded value(s, i, j) over its
    stages (combine max: the bottleneck; +: the sum), skipping stages `allowed` refuses. (inf, None) if none."""
    best = [[math.inf] * (n + 1) for _ in range(k + 1)]
    back = [[-1] * (n + 1) for _ in range(k + 1)]
    best[0][0] = -math.inf if combine is max else 0.0
    for s in range(1, k + 1):
        for j in range(s, n - (k - s) + 1):
            for i in range(s - 1, j):
                if best[s - 1][i] == math.inf or (allowed is not None and not allowed(s - 1, i, j)):
                    continue
                v = combine(best[s - 1][i], value(s - 1, i, j))
                if v < best[s][j]:
                    best[s][j], back[s][j] = v, i
    if best[k][n] == math.inf:
        return math.inf, None
    bounds, j = [], n
    for s in range(k, 0, -1):
        i = back[s][j]
        bounds.append((i, j))
        j = i
    return best[k][n], bounds[::-1]


def _model(costs: list[BlockCost], stages: int, kw: dict[str, Any]) -> _Model:
    kw.setdefault("link_bytes_per_s", math.inf)
    kw.setdefault("latency_s", 0.0)
    kw.setdefault("state_copies", 1)
    kw.setdefault("memory_limit", None)
    kw.setdefault("offload_bytes_per_s", None)
    kw.setdefault("memory", None)
    return _Model(list(costs), stages, **kw)


def evaluate(costs: list[BlockCost], bounds: Bounds, *, method: str = "given", **pipeline: Any) -> Partition:
    """`bounds` priced. Keywords: microbatches, schedule, link_bytes_per_s (default infinite), latency_s (0),
    state_copies (optimizer state per parameter, 1), memory_limit (None), offload_bytes_per_s (None), memory (the
    memory model's stages, StageMemory; None: the blocks' bytes)."""
    model = _model(costs, len(bounds), dict(pipeline))
    _check(bounds, model.n)
    return model.partition(method, bounds)


def optimal(costs: list[BlockCost], stages: int, **pipeline: Any) -> Partition:
    """The split with the smallest predicted step among those whose stages fit `memory_limit`, ties broken by the
    smaller bottleneck; Infeasible (naming the smallest limit that has a split) when none fits. The fastest split of
    all is searched first (and kept for these costs): when its stages fit as they are, it is the answer."""
    model = _model(costs, stages, dict(pipeline))
    fastest = _fastest(costs, stages, pipeline)
    if all(model.fits(model._priced(s, lo, hi, "none")) for s, (lo, hi) in enumerate(fastest)):
        return model.partition("auto", fastest)
    return _within(model)


def _fastest(costs: list[BlockCost], stages: int, pipeline: dict[str, Any]) -> Bounds:
    """The bounds of `optimal` without a memory limit, kept per cost vector and pipeline: a plan asks for the same
    split once per memory setting (precision, checkpointing) and the search is tens of milliseconds. Without a limit
    every stage runs as it is (no offload), so the blocks' times alone, and the bytes crossing each cut where a
    message costs anything, choose it: the key holds only those."""
    free = {k: v for k, v in pipeline.items() if k not in ("memory", "memory_limit")}
    messages = free.get("latency_s", 0.0) or free.get("link_bytes_per_s", math.inf) != math.inf
    key = (tuple((c.forward_s, c.backward_s, c.out_bytes if messages else None) for c in costs), stages,
           tuple(sorted(free.items())))
    if key not in _FASTEST:
        if len(_FASTEST) >= 512:
            _FASTEST.pop(next(iter(_FASTEST)))
        _FASTEST[key] = _within(_model(costs, stages, free)).bounds
    return _FASTEST[key]


_FASTEST: dict[tuple, Bounds] = {}


def _within(model: _Model) -> Partition:
    """`optimal`'s search over the splits whose stages fit the model's limit."""

    def fits(s: int, i: int, j: int) -> bool:
        return model.fits(model.stage(s, i, j))

    time = model.time_s
    allowed = fits if model.limit is not None else None  # (without a limit every stage fits)
    bottleneck, bounds = _solve(model.n, model.k, time, max, allowed)
    if bounds is None:
        raise model.infeasible()
    _, tied = _solve(model.n, model.k, time, lambda a, b: a + b,
                     lambda s, i, j: (allowed is None or fits(s, i, j)) and time(s, i, j) <= bottleneck)
    return model.partition("auto", _branch_and_bound(model, tied or bounds))


def _branch_and_bound(model: _Model, start: Bounds) -> Bounds:
    """The fitting split with the least (step, bottleneck), searched exactly from the split `start`."""
    n, k, m = model.n, model.k, model.m
    work = list(itertools.accumulate((c.forward_s + c.backward_s for c in model.costs), initial=0))
    # least[r][j]: the least bottleneck of blocks j..n-1 cut into r stages, compute alone (transfers, offloads only add)
    least = [[math.inf] * (n + 1) for _ in range(k + 1)]
    for j in range(n):
        least[1][j] = work[n] - work[j]
    for r in range(2, k + 1):
        for j in range(n - r + 1):
            least[r][j] = min(max(work[t] - work[j], least[r - 1][t]) for t in range(j + 1, n - r + 2))

    def key(bounds: Bounds) -> tuple[float, float]:  # (model.step, the bottleneck) of a split whose stages fit
        fwd, bwd, update = zip(*(model.halves(s, lo, hi) for s, (lo, hi) in enumerate(bounds)))
        return (play.step_time(list(fwd), list(bwd), model.schedule, m) + max(update),
                max(model.time_s(s, lo, hi) for s, (lo, hi) in enumerate(bounds)))

    best, best_key = list(start), key(start)
    tol = 1e-12 * max(best_key[0], 1e-30)

    def descend(s: int, i: int, chosen: Bounds, update: float, ahead: tuple[float, float, float]) -> None:
        """`ahead`: schedule.lower_bound of the stages chosen so far and the sums of their forward and backward ops,
        extended a stage at a time (schedule.with_stage)."""
        nonlocal best, best_key
        if s == k:
            found = key(chosen)
            if (found[0] < best_key[0] - tol
                    or (abs(found[0] - best_key[0]) <= tol and found[1] < best_key[1])):
                best, best_key = list(chosen), found
            return
        last = n - (k - s - 1)  # one past the last block this stage may end with: each stage after keeps one
        for j in range(i + 1, last + 1) if s < k - 1 else (n,):
            op = model.halves(s, i, j)
            if op is None:  # (does not fit)
                continue
            f, b, stage_update = op
            deeper = play.with_stage(ahead, f, b, m)
            lower, sum_f, sum_b = deeper
            bound = max(lower, update, stage_update)
            if s < k - 1:  # between the fill and the drain: the slowest of the stages left runs its M micro-batches,
                # and the first micro-batch goes through the blocks left and back
                bound = max(bound, sum_f + max(m * least[k - s - 1][j], work[n] - work[j]) + sum_b)
            if bound > best_key[0] + tol:
                continue
            descend(s + 1, j, chosen + [(i, j)], max(update, stage_update), deeper)

    descend(0, 0, [], 0.0, play.NOTHING_AHEAD)
    return best


def smallest_limit(costs: list[BlockCost], stages: int, **pipeline: Any) -> int:
    """The least per-stage memory limit some split into `stages` fits: the least over splits of their largest
    stage's memory (offload counted when an offload rate is given). Times play no part."""
    model = _model(costs, stages, {**pipeline, "memory_limit": None})
    smallest, _ = _solve(model.n, model.k, model.smallest_memory, max)
    return int(smallest)


def check_memory(costs: list[BlockCost], stages: int, **pipeline: Any) -> None:
    """Infeasible when no split fits `memory_limit`: checkable from the bytes alone, before any timing."""
    model = _model(costs, stages, dict(pipeline))
    if model.limit is not None and smallest_limit(costs, stages, **pipeline) > model.limit:
        raise model.infeasible()


def exhaustive(costs: list[BlockCost], stages: int, **pipeline: Any) -> Partition:
    """`optimal` by brute force over all C(n-1, K-1) splits, the least (step, bottleneck): for tests and the
    benchmark."""
    model = _model(costs, stages, dict(pipeline))
    best, smallest = None, math.inf
    for cuts in itertools.combinations(range(1, model.n), model.k - 1):
        edges = [0, *cuts, model.n]
        p = model.partition("exhaustive", list(zip(edges, edges[1:])))
        smallest = min(smallest, max(model.smallest_memory(s, lo, hi) for s, (lo, hi) in enumerate(p.bounds)))
        if p.fits and (best is None or (p.step_s, p.bottleneck_s) < (best.step_s, best.bottleneck_s)):
            best = p
    if best is None:
        raise _infeasible(model, int(smallest))
    return best


def uniform(n: int, stages: int) -> Bounds:
    """Equal block counts, the first n mod K stages one block more (DeepSpeed's partition_uniform)."""
    if not 1 <= stages <= n:
        raise UserError(f"--stages {stages}: give 1 to {n} (the model has {n} blocks)")
    size, extra = divmod(n, stages)
    edges = [0]
    for s in range(stages):
        edges.append(edges[-1] + size + (1 if s < extra else 0))
    return list(zip(edges, edges[1:]))


def by_params(costs: list[BlockCost], stages: int) -> Bounds:
    """DeepSpeed's partition_method="parameters": the split minimising the largest stage's parameter count."""
    return _min_max(costs, stages, [c.param_bytes for c in costs])


def by_time(costs: list[BlockCost], stages: int) -> Bounds:
    """torchgpipe's balance_by_time: the split minimising the largest stage's forward + backward time, with
    no regard to memory or transfers."""
    return _min_max(costs, stages, [c.forward_s + c.backward_s for c in costs])


def _min_max(costs: list[BlockCost], stages: int, weights: list[float]) -> Bounds:
    if not 1 <= stages <= len(costs):
        raise UserError(f"--stages {stages}: give 1 to {len(costs)} (the model has {len(costs)} blocks)")
    total = list(itertools.accumulate(weights, initial=0))
    _, bounds = _solve(len(weights), stages, lambda s, i, j: total[j] - total[i], max)
    assert bounds is not None
    return bounds


BASELINES = {"uniform": lambda costs, k: uniform(len(costs), k), "params": by_params, "time": by_time}


def baselines(costs: list[BlockCost], stages: int, **pipeline: Any) -> dict[str, Partition]:
    """The uniform, parameter-count and time-balanced splits, priced by the same model."""
    return {name: evaluate(costs, split(costs, stages), method=name, **pipeline) for name, split in BASELINES.items()}


def _check(bounds: Bounds, n: int) -> None:
    if not bounds or bounds[0][0] != 0 or bounds[-1][1] != n or any(lo >= hi for lo, hi in bounds) or any(
            a[1] != b[0] for a, b in zip(bounds, bounds[1:])):
        raise UserError(f"stage bounds {[list(b) for b in bounds]} do not cover blocks 0..{n} contiguously")
