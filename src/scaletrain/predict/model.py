"""The performance model: one training step's phases, memory and limit for one configuration, as pure
functions of the model's ops, the calibration's laws and the run's settings (docs/predict.md).

No torch.distributed and no printing here: `points.py` builds the inputs (tracing the model, fitting
the laws) and this module does the arithmetic. Phases carry the profiler's keys (docs/metrics.md) so a
prediction and a measurement compare phase by phase:

    data_wait     the loader: batch x seconds per sample with --workers 0; with k workers the part of
                  their production (batch x per-sample / k) that the step does not cover, plus hand-over
    h2d, other    the training loop's own, as calibrated on the reference network
    forward       sum of the ops' forward times (+ the loss), x the loop factor calibrated for as many
                  ranks per node
    backward      sum of the ops' backward times, x the loop factor: until the last bucket is ready
    comm_exposed  DDP's buckets reduced one at a time in backward's order (perf/buckets.py), the part
                  that outlasts backward; a parameter server's push, apply and pull after backward
    optimizer     a law in tensors and elements per optimizer, + the loop's own overhead
Processes that share cores (ranks x threads, plus busy loader workers, beyond the node's cores) stretch
the compute phases by the CPU time they need over the cores there are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from scaletrain.perf import alphabeta, buckets, wire

PHASES = ("data_wait", "h2d", "forward", "backward", "comm_exposed", "optimizer", "other")
OPTIMIZER_STATE = {"sgd": 1, "nesterov": 1, "adagrad": 1, "adamw": 2, "plain-sgd": 0}  # buffers per parameter
BUCKET_CAPS_MB = (None, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 25.0, 64.0)  # None: DDP's default (1 MiB, then 25)
PREFETCH = 2  # DataLoader's prefetch_factor: batches in flight per worker


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
    ps_servers: int = 1
    bucket_cap_mb: float | None = None
    optimizer: str = "sgd"
    cores: int = 1  # cores per node
    shared_cores: int | None = None  # the nodes are testbed hosts sharing this many cores of one machine
    threads: int | None = None  # intra-op threads per rank (default: cores // ranks per node)
    train_samples: int = 0
    sample_s: float = 0.0  # loader seconds per sample (decode + augment + collate)
    sample_bytes: int = 0  # one sample's tensor bytes
    worker_interference: float | None = None  # compute seconds a busy loader worker costs per second of its work
    stages: int = 1  # pipeline stages (the ranks of one replica); the others read different data
    cpu_compute: bool = True  # forward and backward run on the CPU's cores (False: on an accelerator)

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes

    @property
    def servers(self) -> int:
        return self.ps_servers if self.strategy.startswith("ps-") else 0

    @property
    def trainers(self) -> int:
        """Ranks that read different data and share the global batch (a pipeline's replicas)."""
        return (self.world - self.servers) // max(1, self.stages)

    @property
    def splits_model(self) -> bool:
        """A pipeline or FSDP: no DDP buckets; their communication is priced by predict/pipeline.py."""
        return self.strategy in ("pipeline", "fsdp")

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

    def factor(self, group: str, direction: str) -> float:
        """The factor of a `group` op's isolated time in `direction` (forward | backward) inside a step."""
        compute = self.forward if direction == "forward" else self.backward
        memory = self.forward_memory if direction == "forward" else self.backward_memory
        return memory if group == "memory" and memory is not None else compute


def compute_stretch(s: Setting, loader_cpu_s: float, compute_s: float) -> float:
    """How much slower compute runs because processes share cores: ranks' threads and busy loader workers
    against the cores there are (1 = not at all).

    Loader workers on cores the ranks' threads already fill: with a calibrated `worker_interference` k,
    compute grows by k x the workers' CPU seconds per step (a worker preempting one thread of a parallel
    region stalls the whole team at its next barrier, so k is above 1); without it, by the CPU time
    needed over the cores there are. On an accelerator, compute shares no cores: 1."""
    if not s.cpu_compute:
        return 1.0
    threads = s.nproc * s.rank_threads
    cores = s.cores
    if s.shared_cores:  # testbed hosts on one machine: every host's threads compete for its cores
        threads *= s.nnodes
        cores = s.shared_cores
    over = max(1.0, threads / max(1, cores))
    if s.workers and loader_cpu_s > 0 and compute_s > 0:
        ranks = s.nproc if not s.shared_cores else s.nproc * s.nnodes
        if s.worker_interference is not None:
            if threads + ranks * s.workers > cores:
                over += s.worker_interference * loader_cpu_s / compute_s
        else:
            # CPU seconds a step needs on the node: every rank's compute on its threads and its loader's work
            demand = ranks * (compute_s * s.rank_threads + loader_cpu_s)
            over = max(over, demand / (cores * compute_s))
    return over


def comm_time_fn(s: Setting, network: dict[str, Any], strategy: str) -> Callable[[int], float]:
    """Seconds to reduce one bucket of `bytes` fp32 gradient bytes over the trainers (alpha-beta)."""
    alpha, beta = link(s, network, "ring" if strategy == "ring" else "allreduce")
    world = s.trainers

    def seconds(nbytes: int) -> float:
        if world < 2:
            return 0.0
        numel = nbytes // 4
        if wire.linear(s.compress):
            payload = wire.compressed_bytes(numel, s.compress) if s.compress and s.compress[0] != "powersgd" else \
                nbytes if not s.compress else nbytes // 8  # powersgd: factors, roughly rank/min(n,m) of it
            return alphabeta.predict(alpha, beta, world, payload)
        payload = wire.compressed_bytes(numel, s.compress)
        return (world - 1) * alpha + (world - 1) * payload * beta  # all-gathered
    return seconds


def link(s: Setting, network: dict[str, Any], kind: str) -> tuple[float, float]:
    """(alpha, beta) of the collective: the calibrated local fit inside one node; across nodes the slower
    of it and the declared inter-node link, whose latency adds to the software's."""
    intra = network["intra"].get(kind) or network["intra"].get("allreduce") or {"alpha_s": 0.0, "beta_s_per_byte": 0.0}
    alpha, beta = intra["alpha_s"], intra["beta_s_per_byte"]
    inter = network.get("inter")
    if s.nnodes > 1 and inter:
        alpha = alpha + inter["alpha_s"]
        beta = max(beta, inter["beta_s_per_byte"])
    return alpha, beta


def predict_step(ops: list[OpCost], s: Setting, loop: Loop, network: dict[str, Any],
                 optimizer_s: Callable[[int, int], float], loss_s: tuple[float, float] = (0.0, 0.0),
                 loader_first_batch_s: float = 0.0, handoff_s: float = 0.0) -> dict[str, Any]:
    """The step's phases (seconds), its communication and the numbers the limit is named from.

    `optimizer_s(tensors, numel)` is the optimizer's calibrated law at this point's threads."""
    grads = [g for op in ops for g in op.grad_bytes]
    fwd = sum(o.forward_s * loop.factor(o.group, "forward") for o in ops) + loss_s[0] * loop.factor("memory", "forward")
    bwd = sum(o.backward_s * loop.factor(o.group, "backward") for o in ops) + \
        loss_s[1] * loop.factor("memory", "backward")
    ps = s.strategy.startswith("ps-")
    opt = 0.0 if ps else optimizer_s(len(grads), sum(grads) // 4) + loop.optimizer_s
    loader_cpu = s.batch_size * s.sample_s
    stretch = compute_stretch(s, loader_cpu, fwd + bwd + opt)
    fwd, bwd, opt = fwd * stretch, bwd * stretch, opt * stretch

    comm = {"bytes_per_step": 0, "buckets": 0, "comm_total_s": 0.0, "comm_hidden_s": 0.0, "overlap_ratio": None}
    exposed = 0.0
    residual = loop.comm_s + loop.comm_per_compute * (fwd + bwd)  # ranks out of step: see Loop
    if s.trainers > 1 and not ps and grads and not s.splits_model:
        # gradients in the order backward produces them: ops in reverse, each op's parameters in reverse
        ready, sizes, elapsed = [], [], 0.0
        for op in reversed(ops):
            elapsed += op.backward_s * loop.factor(op.group, "backward") * stretch
            for g in reversed(op.grad_bytes):
                ready.append(elapsed)
                sizes.append(g)
        ready = [r * bwd / elapsed for r in ready] if elapsed > 0 else ready
        comm_time = comm_time_fn(s, network, s.strategy)
        result = buckets.backward_overlap(ready, sizes, comm_time, s.bucket_cap_mb)
        exposed = result["comm_exposed_s"] + residual
        best_cap, best = buckets.best_bucket_cap(ready, sizes, comm_time, BUCKET_CAPS_MB)
        comm = {"bytes_per_step": sum(wire.ddp_bytes(b // 4, s.trainers, s.compress) for b in result["bucket_bytes"]),
                "buckets": len(result["buckets"]), "comm_total_s": result["comm_total_s"],
                "comm_hidden_s": result["comm_hidden_s"], "overlap_ratio": result["overlap_ratio"],
                "best_bucket_cap_mb": best_cap, "best_overlap_ratio": best["overlap_ratio"],
                "best_comm_exposed_s": best["comm_exposed_s"] + residual}
    elif ps and s.trainers >= 1:
        exposed, comm = _parameter_server(s, network, sum(grads), len(grads), optimizer_s, residual, fwd + bwd)

    produce = loader_cpu + handoff_s
    busy = fwd + bwd + opt + exposed + loop.h2d_s + loop.other_s
    if s.workers == 0:
        data_wait = produce
    else:
        # k workers each make a whole batch: one arrives every batch x per-sample / k seconds at best
        # (on an accelerator node the workers of a rank share the cores the node has per rank)
        parallel = s.workers if s.cpu_compute else max(1, min(s.workers, s.cores // max(1, s.nproc)))
        data_wait = max(handoff_s, loader_cpu * stretch / parallel - busy + handoff_s)
    phases = {"data_wait": data_wait, "h2d": loop.h2d_s, "forward": fwd, "backward": bwd, "comm_exposed": exposed,
              "optimizer": opt, "other": loop.other_s}
    step = sum(phases.values())
    return {"phases_s": phases, "step_time_s": step, "comm": comm, "stretch": stretch,
            "epoch_start_s": loader_first_batch_s if s.workers else 0.0}


def _parameter_server(s: Setting, network: dict[str, Any], grad_bytes: int, tensors: int,
                      optimizer_s: Callable[[int, int], float], residual_s: float,
                      compute_s: float) -> tuple[float, dict]:
    """ps-sync: every worker pushes its gradient to the servers, each applies the update on its shard and
    sends it back: 2 alpha + 2 W x (its shard) x beta on the busiest server link, plus the apply.
    ps-async: a worker's own push and pull; the server link is shared, so a worker also waits for its
    share of the others' traffic once that exceeds its own compute."""
    alpha, beta = link(s, network, "ps")
    workers, servers = s.trainers, max(1, s.servers)
    shard = grad_bytes / servers
    push = wire.compressed_bytes(int(shard // 4), s.compress) if s.compress else shard
    apply = optimizer_s(max(1, tensors // servers), int(shard // 4))
    own = 2 * alpha + (push + shard) * beta
    if s.strategy == "ps-sync":
        exposed = 2 * alpha + workers * (push + shard) * beta + apply
    else:
        server_busy = workers * ((push + shard) * beta + apply)
        exposed = max(own + apply, server_busy - compute_s)
    sent = int(servers * push)
    return exposed + residual_s, {"bytes_per_step": sent, "buckets": servers, "comm_total_s": exposed,
                                   "comm_hidden_s": 0.0, "overlap_ratio": 0.0 if workers else None}


def memory(s: Setting, params: int, activation_bytes: int, batch_input_bytes: int,
           baseline_bytes: int = 0) -> dict[str, int]:
    """Peak bytes per rank: parameters, gradients, optimizer state (fp32), the activations autograd keeps
    for backward, DDP's gradient buckets (a flat copy of the gradients), the loader's batches in flight,
    and the process's resident baseline (interpreter, torch, the loop) as calibrated."""
    p = 4 * params
    ps = s.strategy.startswith("ps-")
    out = {"parameters": p, "gradients": p, "optimizer": 0 if ps else OPTIMIZER_STATE.get(s.optimizer, 1) * p,
           "activations": activation_bytes, "buckets": p if (s.trainers > 1 and not ps) else 0,
           "loader": batch_input_bytes * (1 + PREFETCH * s.workers), "baseline": baseline_bytes}
    return out


def limit(phases: dict[str, float], batch_efficiency: float) -> tuple[str, str]:
    """The point's limit and one line on it: what holds the step back most."""
    step = sum(phases.values()) or 1.0
    comm, data = phases["comm_exposed"] / step, phases["data_wait"] / step
    bubble = (phases.get("bubble", 0.0) + phases.get("p2p", 0.0)) / step
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
