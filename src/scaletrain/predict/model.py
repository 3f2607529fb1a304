"""The performance model: one training step's phases and limit for one configuration, as pure
functions of the model's ops, the calibration's laws and the run's settings (docs/predict.md).

No torch.distributed and no printing here: `points.py` builds the inputs (tracing the model, fitting
the laws) and this module does the arithmetic. Phases carry the profiler's keys (docs/metrics.md) so a
prediction and a measurement compare phase by phase:

    data_wait     the loader: batch x seconds per sample with --workers 0; with workers the rank's taking of
                  a made batch, and what of the batch's making the step does not cover (predict/workers.py)
    h2d, other    the training loop's own, as calibrated on the reference network
    forward       sum of the ops' forward times (+ the loss), x the loop factor calibrated for as many
                  ranks per node
    backward      sum of the ops' backward times, x the loop factor: until the last bucket is ready
    comm_exposed  the strategy's own price (Strategy.cost through the registry, predict/pricing.py): DDP's
                  buckets reduced one at a time in backward's order, the part that outlasts backward; a
                  parameter server's push, apply and pull after backward; a pipeline's replicas' all-reduce
    optimizer     a law in tensors and elements per optimizer, + the loop's own overhead (a strategy whose
                  rank applies no update, a parameter server's worker: none)
Ranks' threads beyond the node's cores stretch the compute phases by the threads over the cores (ranks of one thread
that do not divide among the cores evenly: by their mean stretch, and the step waits for the slowest); loader
workers on the cores a rank's threads fill take their time from its compute (predict/workers.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from scaletrain.config.layout import Layout
from scaletrain.predict.pricing import BUCKET_CAPS_MB, NO_COMM, link  # noqa: F401 (re-exported)
from scaletrain.predict.workers import Workers, worker_cost

PHASES = ("data_wait", "h2d", "forward", "backward", "comm_exposed", "optimizer", "other")


@dataclass
class Setting:
    """One point's run settings, as the model needs them."""

    batch_size: int  # per rank (per worker with a parameter server)
    precision: str = "fp32"
    nproc: int = 1  # processes per node (servers included)
    nnodes: int = 1
    workers: int = 0
    strategy: str = "allreduce"
    compress: tuple | None = None
    servers: int = 0  # the layout's (config/layout.py): parameter-server ranks
    bucket_cap_mb: float | None = None
    optimizer: str = "sgd"
    cores: int = 1  # cores per node
    shared_cores: int | None = None  # the nodes are testbed hosts sharing this many cores of one machine
    threads: int | None = None  # intra-op threads per rank (default: cores // ranks per node)
    train_samples: int = 0
    sample_s: float = 0.0  # loader seconds per sample (decode + augment + collate)
    data_line: tuple[float, float] = (1.0, 0.0)  # Loop.data_factor, data_s: the rank's own loading inside a step
    sample_bytes: int = 0  # one sample's tensor bytes
    buffer_bytes: int = 0  # the model's buffers (a batch norm's running statistics): DDP broadcasts them each forward
    stages: int = 1  # the layout's: a pipeline's stages
    tiles: int = 1  # the layout's: the ranks that hold one image's tiles
    cpu_compute: bool = True  # forward and backward run on the CPU's cores (False: on an accelerator)
    stretch: bool = True  # processes sharing cores stretch compute (predictor.CORRECTIONS "core_stretch")

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes

    @property
    def strategy_class(self):
        """The strategy's class (comm/registry.py): it prices its own communication (Strategy.cost)."""
        from scaletrain.predict.pricing import strategy_of

        return strategy_of(self.strategy)

    @property
    def layout(self) -> Layout:
        return Layout(nodes=self.nnodes, per_node=self.nproc, servers=self.servers, stages=self.stages,
                      tiles=self.tiles)

    @property
    def trainers(self) -> int:
        """Ranks that read different data and share the global batch (a pipeline's replicas)."""
        return self.layout.replicas

    @property
    def rank_threads(self) -> int:
        return self.threads or max(1, self.cores // self.nproc)


@dataclass
class OpCost:
    """An op of the workload with its calibrated times (seconds at this point's batch)."""

    forward_s: float
    backward_s: float
    grad_bytes: list[int] = field(default_factory=list)  # its parameters' gradients, registration order
    source: str = "regression"  # measured | regression | none
    group: str = "compute"  # kinds.GROUP: which of the loop's factors applies
    name: str = ""  # the workload op's (its fx node's) name: where a strategy's share of the model ends
    cold_bytes: tuple[float, float] = (0.0, 0.0)  # (forward, backward) bytes a step brings it cold (predict/l2.py)
    kind: str = ""  # kinds.KINDS (or "view"): the order its gradients arrive in (perf/buckets.backward_order)


@dataclass
class Loop:
    """What the training loop adds, from the calibration's reference runs at this many ranks per node."""

    forward: float = 1.0  # compute-bound ops (conv, linear)
    backward: float = 1.0
    forward_memory: float | None = None  # memory-bound ops and the loss (None: as compute-bound)
    backward_memory: float | None = None
    optimizer_s: float = 0.0  # the optimizer phase's own overhead beyond its law (zero_grad, the loop)
    h2d_s: float = 0.0
    other_s: float = 0.0
    comm_s: float = 0.0  # exposed communication the bucket model does not explain (DDP's own, peers' jitter) ...
    comm_per_compute: float = 0.0  # ... and its part that grows with the step's forward + backward
    comm_compute_upto_s: float | None = None  # ... up to the most forward + backward it was fitted over (None: no end)
    forward_s: float = 0.0  # seconds a step's forward takes beyond its factored ops on this many ranks (a rank's
    backward_s: float = 0.0  # DDP wrapper, its compute slowed after a collective): per step, not per op
    data_factor: float = 1.0  # the rank's own loading (no workers) inside a step: this x the loader's law for the
    data_s: float = 0.0  # batch, + this per step (the loop's fetch of a batch; caches colder than the loader alone)
    optimizer_per_compute: float = 0.0  # optimizer_s and other_s grow by these x the step's forward + backward (the
    other_per_compute: float = 0.0  # longer the step, the colder its caches when the update and the loop run) ...
    overheads_upto_s: float | None = None  # ... up to the most forward + backward they were fitted over
    per_op: tuple[float, float] = (0.0, 0.0)  # (forward, backward) seconds each op with a time adds in a step ...
    per_cold_byte: tuple[float, float] = (0.0, 0.0)  # ... and per byte a step brings it cold (OpCost.cold_bytes)

    def overheads(self, compute_s: float) -> tuple[float, float]:
        """(the optimizer phase beyond its law, `other`) of a step whose forward + backward take `compute_s`."""
        x = compute_s if self.overheads_upto_s is None else min(compute_s, self.overheads_upto_s)
        return self.optimizer_s + self.optimizer_per_compute * x, self.other_s + self.other_per_compute * x

    def factor(self, group: str, direction: str) -> float:
        """The factor of a `group` op's isolated time in `direction` (forward | backward) inside a step."""
        compute = self.forward if direction == "forward" else self.backward
        memory = self.forward_memory if direction == "forward" else self.backward_memory
        return memory if group == "memory" and memory is not None else compute

    def op_s(self, op: OpCost, direction: str) -> float:
        """An op's seconds in `direction` inside a step: its isolated time x its group's factor, + what the step adds
        to each op (a constant, and its bytes fetched cold: correction op_overhead)."""
        i = 0 if direction == "forward" else 1
        seconds = op.forward_s if i == 0 else op.backward_s
        if seconds <= 0:
            return 0.0
        return seconds * self.factor(op.group, direction) + self.per_op[i] + self.per_cold_byte[i] * op.cold_bytes[i]


def computing_ranks(s: Setting) -> tuple[float, int]:
    """(the ranks that compute on one node's cores, those cores): every rank but the parameter servers, which
    wait while their workers compute (a testbed's hosts all share one machine's cores)."""
    if s.shared_cores:
        return s.layout.trainers, s.shared_cores
    return s.layout.trainers / max(1, s.nnodes), s.cores


def compute_stretch(s: Setting) -> float:
    """How much slower compute runs because ranks' threads share cores, on average over the computing ranks (1 = not
    at all; on an accelerator, compute shares no cores: 1): the threads over the cores, or for ranks of one thread
    each that do not divide among the cores evenly, the mean of `rank_stretches` (3 ranks on 2 cores: 5/3, not 1.5)."""
    if not s.cpu_compute or not s.stretch:
        return 1.0
    ranks, cores = computing_ranks(s)
    uneven = rank_stretches(s)
    if uneven is not None:
        return sum(uneven) / len(uneven)
    return max(1.0, ranks * s.rank_threads / max(1, cores))


def slowest_stretch(s: Setting) -> float:
    """The stretch of the slowest computing rank: a step whose ranks meet at its end (Strategy.lockstep) waits for it.
    The mean stretch unless ranks of one thread do not divide among the cores evenly (`rank_stretches`)."""
    uneven = rank_stretches(s) if s.cpu_compute and s.stretch else None
    return max(uneven) if uneven else compute_stretch(s)


def rank_stretches(s: Setting) -> list[int] | None:
    """Each computing rank's stretch where ranks of one thread each outnumber the cores and do not divide among them
    evenly; None otherwise. The scheduler keeps a process on its core's queue for longer than a step: with 3 on 2
    cores, two share one core and the third has one alone (their step's forward + backward: 2x, 2x and 1x, not 1.5x
    each), and the collective that ends the step waits for the pair. Measured (2026-11-29, LeNet-5 on three testbed
    hosts sharing 2 cores): forward + backward 1.70x their time alone on average, and each step's exposed
    all-reduce 5.5 ms above the last rank's own (15.3-17.1 ms, what commbench measures it alone)."""
    ranks, cores = computing_ranks(s)
    if s.rank_threads != 1 or cores < 1 or ranks <= cores or float(ranks) != int(ranks) or int(ranks) % cores == 0:
        return None
    ranks = int(ranks)
    crowded, q = ranks % cores, ranks // cores  # `crowded` cores hold q + 1 ranks, the others q
    return [q + 1] * (crowded * (q + 1)) + [q] * ((cores - crowded) * q)


def cores_busy(s: Setting) -> float:
    """The share of the computing ranks whose communication finds no idle core beside their compute threads (each
    rank's collective wants one core of its own): 1 where the ranks' threads fill the cores, 0 where every rank
    has a spare core (on an accelerator: 0, compute shares no cores)."""
    if not s.cpu_compute:
        return 0.0
    ranks, cores = computing_ranks(s)
    return min(1.0, max(0.0, ranks * s.rank_threads + ranks - cores) / max(1.0, ranks))


def cores_per_rank(s: Setting) -> float:
    """The cores each computing rank has to itself and its loader workers."""
    ranks, cores = computing_ranks(s)
    return cores / max(1.0, ranks)


def compute_s(ops: list[OpCost], s: Setting, loop: Loop, loss_s: tuple[float, float] = (0.0, 0.0)
              ) -> tuple[float, float]:
    """(forward, backward) of one rank's whole model at the point's batch: the ops' times with the loop's factors
    and the loss, stretched where ranks share cores; what a strategy's cost starts from (and a plan's bound on a
    step where the strategy runs the whole model on every trainer: Strategy.computes_whole_model)."""
    fwd = sum(loop.op_s(o, "forward") for o in ops) + loss_s[0] * loop.factor("memory", "forward") + loop.forward_s
    bwd = sum(loop.op_s(o, "backward") for o in ops) + loss_s[1] * loop.factor("memory", "backward") + loop.backward_s
    stretch = compute_stretch(s)
    return fwd * stretch, bwd * stretch


def predict_step(ops: list[OpCost], s: Setting, loop: Loop, network: dict[str, Any],
                 optimizer_s: Callable[[int, int], float], loss_s: tuple[float, float] = (0.0, 0.0),
                 workers: Workers | None = None, **context: Any) -> dict[str, Any]:
    """The step's phases (seconds), its communication and the numbers the limit is named from: the strategy's step
    (strategy_step), then what its loader adds (with_input)."""
    return with_input(strategy_step(ops, s, loop, network, optimizer_s, loss_s, **context), s, workers)


def strategy_step(ops: list[OpCost], s: Setting, loop: Loop, network: dict[str, Any],
                  optimizer_s: Callable[[int, int], float], loss_s: tuple[float, float] = (0.0, 0.0),
                  **context: Any) -> dict[str, Any]:
    """The step before its input: the compute phases and what the strategy adds to them, which the loader's workers
    change nothing of (a plan's candidates that differ in workers alone share it; `data_wait` is 0 here).

    `optimizer_s(tensors, numel)` is the optimizer's calibrated law at this point's threads. The strategy
    prices its own communication (`Strategy.cost`, predict/pricing.py), from the compute phases computed here;
    `context` (cfg, facts, predictor) is what it may read beyond them. Memory per rank is the one memory model's
    (comm/memory.per_rank, through the strategy's own `memory`: predict/points.rank_memory)."""
    from scaletrain.predict.pricing import Pricing

    grads = [g for op in ops for g in op.grad_bytes]
    fwd, bwd = compute_s(ops, s, loop, loss_s)
    strategy = s.strategy_class
    beyond_law, other = loop.overheads(fwd + bwd)
    opt = optimizer_s(len(grads), sum(grads) // 4) + beyond_law if strategy.local_update else 0.0
    stretch = compute_stretch(s)
    opt = opt * stretch
    compute = {"h2d": loop.h2d_s, "forward": fwd, "backward": bwd, "optimizer": opt, "other": other}
    pricing = Pricing(s, ops, loop, network, optimizer_s, dict(compute), stretch, busy=cores_busy(s), **context)
    cost = strategy.cost(pricing) if s.trainers >= 1 else None
    phases = {"data_wait": 0.0, **compute, "comm_exposed": cost.comm_exposed_s if cost else 0.0}
    if cost is not None:
        phases.update(cost.phases)
    slowest = slowest_stretch(s)
    if cost is not None and strategy.lockstep and slowest > stretch:  # the ranks meet the slowest at the step's end
        phases["comm_exposed"] += (slowest / stretch - 1) * (phases["forward"] + phases["backward"] + opt)
    order = ("data_wait", "h2d", "forward", "backward", "comm_exposed", "optimizer")
    phases = {**{k: phases[k] for k in order}, **{k: v for k, v in phases.items() if k not in order and k != "other"},
              "other": phases["other"]}
    return {"phases_s": phases, "comm": cost.comm if cost else dict(NO_COMM), "stretch": stretch,
            "extra": cost.extra if cost else {}, "flops_share": cost.flops_share if cost else 1.0}


def with_input(step: dict[str, Any], s: Setting, workers: Workers | None = None) -> dict[str, Any]:
    """strategy_step's step with its input: the rank's own loading (no workers: `data_wait`) or its `s.workers`
    loader processes (`workers`: the calibration's, predict/workers.py), what they take of the rank's cores and
    what of the batch they leave it to wait for. A new step: `step` is left as it was."""
    phases = dict(step["phases_s"])
    loader_cpu = s.batch_size * s.sample_s
    lost, w = 0.0, workers or Workers()
    if s.workers == 0:
        data_wait = s.data_line[0] * loader_cpu + s.data_line[1]
    else:
        computing = phases["forward"] + phases["backward"] + phases["optimizer"]
        loop_s = phases["h2d"] + phases["other"]
        multi = computing if s.cpu_compute else 0.0  # on an accelerator the rank's one thread drives it
        lost, data_wait = worker_cost(w, s.workers, loader_cpu + w.handoff_s, multi, loop_s + computing - multi,
                                      sum(phases.values()) - computing - loop_s, cores_per_rank(s),
                                      s.rank_threads if s.cpu_compute else 0)
        phases["forward"] += lost  # a worker starts the next batch as the rank takes this one: on its forward
    phases["data_wait"] = data_wait
    return {**step, "phases_s": phases, "step_time_s": sum(phases.values()), "workers_lost_s": lost,
            "epoch_start_s": w.startup_s + loader_cpu if s.workers else 0.0}  # the workers' start and first batch


def limit(phases: dict[str, float], batch_efficiency: float) -> tuple[str, str]:
    """The point's limit and one line on it: what holds the step back most."""
    step = sum(phases.values()) or 1.0
    comm, data = phases["comm_exposed"] / step, phases["data_wait"] / step
    bubble = (phases.get("bubble", 0.0) + phases.get("p2p", 0.0)) / step
    tiles = (phases.get("halo", 0.0) + phases.get("gather", 0.0)) / step
    if tiles >= 0.15 and tiles >= max(comm, data, bubble):
        return "tiles", f"{tiles:.0%} of the step exchanges tiles' halos and gathers them: fewer tiles, larger " \
                        "images per tile, or an earlier --spatial-until"
    if bubble >= 0.15 and bubble >= max(comm, data):
        return "pipeline", f"{bubble:.0%} of the step waits in the pipeline (bubble, transfers): more micro-batches, " \
                           "fewer stages or a better-balanced split"
    if data >= 0.15 and data >= comm:
        return "input", f"the loader holds back {data:.0%} of the step: add --workers or a faster dataset format"
    if comm >= 0.15:
        return "communication", f"{comm:.0%} of the step waits for gradient communication: a faster link, " \
                                "compression or larger per-device batches"
    if batch_efficiency < 0.8:
        return "small-batch", (f"the per-device batch keeps the device at {batch_efficiency:.0%} of its large-batch "
                               "efficiency: fewer devices or a larger batch")
    return "compute", "compute-bound: more devices still help"


def percent(x: float) -> str:
    return f"{x:.0%}" if math.isfinite(x) else "-"
