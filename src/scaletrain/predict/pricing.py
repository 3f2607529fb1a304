"""The cost seam: what a strategy prices its step from (`Pricing`), what it answers (`Cost`), and the
pricing every gradient-bucket strategy shares (`ddp_buckets`). Each strategy answers for its own cost in its
own module (`Strategy.cost(pricing)`, found through comm/registry.py), exactly as it answers for training:
model.py computes the step's compute phases, asks the strategy, and adds
the loader's wait; it names no strategy (docs/predict.md, "The cost seam")."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from scaletrain.perf import alphabeta, buckets, wire

BUCKET_CAPS_MB = (None, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 25.0, 64.0)  # None: DDP's default (1 MiB, then 25)
NO_COMM = {"bytes_per_step": 0, "buckets": 0, "comm_total_s": 0.0, "comm_hidden_s": 0.0, "overlap_ratio": None}


@dataclass
class Pricing:
    """One point's facts, as a strategy prices its step from them (seconds; bytes)."""

    setting: Any  # model.Setting
    ops: list  # model.OpCost, forward order, at the point's batch per rank
    loop: Any  # model.Loop
    network: dict[str, Any]  # {"intra": {fit kind: alpha, beta}, "inter": alpha, beta or None}
    optimizer_s: Callable[[int, int], float]  # the optimizer's law: (tensors, elements) -> seconds
    phases: dict[str, float]  # forward, backward, optimizer (the local update), h2d, other: compute so far
    stretch: float  # compute's stretch from shared cores (model.compute_stretch)
    busy: float = 0.0  # the share of trainers whose collectives find no idle core (model.cores_busy)
    cfg: Any = None  # the TrainConfig (pipelines and FSDP read the model and their settings); None in unit tests
    facts: dict[str, Any] = field(default_factory=dict)  # the data's samples, classes, channels, image size
    predictor: Any = None  # the basis's predictor (a pipeline prices its blocks with it)

    @property
    def grads(self) -> list[int]:
        """Gradient bytes of each parameter tensor, registration order."""
        return [g for op in self.ops for g in op.grad_bytes]

    @property
    def residual_s(self) -> float:
        """Exposed communication the bucket model does not explain (ranks out of step, DDP's own): the loop's line
        in the step's compute, never under what one collective between computing ranks waits beyond an idle one
        (`skew_s`; the 2-rank reference runs, 27-108 ms of compute, cannot show the floor a short step meets)."""
        if "comm_residual" in self.without:
            return 0.0
        compute = self.phases["forward"] + self.phases["backward"]
        upto = self.loop.comm_compute_upto_s
        if upto is not None and "comm_range" not in self.without:
            compute = min(compute, upto)
        line = self.loop.comm_s + self.loop.comm_per_compute * compute
        return line if "skew_floor" in self.without else max(line, self.skew_s())

    @property
    def without(self) -> frozenset[str]:
        """The corrections the basis leaves out (predictor.CORRECTIONS; none on a data sheet, in unit tests)."""
        return getattr(self.predictor, "without", frozenset())

    def link(self, kind: str) -> tuple[float, float]:
        return link(self.setting, self.network, kind)

    def comm_cpu(self, kind: str) -> Callable[[int], float] | None:
        """The compute a bucket of `bytes` fp32 gradient bytes takes from backward while it is reduced beside it:
        the `kind` collective's CPU seconds (commbench's `cpu_s` fit: on loopback the transport's copies are
        the host's cores' work) times the share of the trainers that find no idle core for it (`busy`). None where
        the basis has no such fit (a data sheet, calibrations before 2026-11-29) or no trainer lacks a core."""
        fit = self.network.get("intra", {}).get(kind) or {}
        if self.busy <= 0 or fit.get("cpu_alpha_s") is None or "overlap_cpu" in self.without:
            return None
        seconds = reduce_seconds(self.setting, (fit["cpu_alpha_s"], fit["cpu_beta_s_per_byte"]))
        return lambda nbytes: self.busy * seconds(nbytes)

    def host_law(self, column: str, **match: Any):
        """The strategy's own host work `column` as the calibration timed it (Strategy.host_work, its `host_key`):
        seconds = law(tensors, numel[, extra_numel]) at this point's threads; None where the basis has none (a data
        sheet; a calibration made before 2026-11-28; unit tests without a predictor)."""
        get = getattr(self.predictor, "host_law", None)
        key = self.setting.strategy_class.host_key
        return get(key, column, self.setting.rank_threads, match) if get is not None and key else None

    def exchange_link(self, kind: str) -> tuple[float, float]:
        """`kind`'s alpha-beta as a DDP hook's exchange pays it between computing ranks: its own bytes' rate, and,
        where a residual is priced, the all-reduce's latency. The residual is what the reference runs' exposed
        all-reduce took beyond the all-reduce's own price; a collective whose idle fit has a shorter latency (the
        ring: 0.43 ms against 0.88, commbench between idle ranks) does not keep it between computing ranks, where
        that wait holds it: 16 pairs of ring and all-reduce runs (LeNet-5, the MLP; batch 32 / 64; fp32 / bf16, two
        exhaustive plans each) measured the ring's exposed wait a median 0.0 ms from the all-reduce's (-0.6..+0.4),
        where the idle fits priced it 0.9-1.1 ms shorter (`shared_latency`)."""
        alpha, beta = self.link(kind)
        if kind != "allreduce" and "shared_latency" not in self.without and self.residual_s > 0:
            alpha = self.link("allreduce")[0]
        return alpha, beta

    def skew_s(self) -> float:
        """What one collective between ranks that compute between collectives waits beyond an idle one: for the
        rank whose compute ran longer (the halo fit's latency beyond the idle point-to-point's: commbench's
        `halo` swaps between computing ranks). A spatial tile's BatchNorm statistics and FSDP's per-unit
        collectives pay it each; 0 where the basis has no halo fit (a data sheet, calibrations before
        2026-11-27)."""
        if "halo" not in self.network.get("intra", {}):
            return 0.0
        return max(0.0, self.link("halo")[0] - self.link("ps")[0])


@dataclass
class Cost:
    """A strategy's answer: its exposed communication, what it says of its traffic (prediction.json `comm`),
    phases it replaces or adds (a pipeline's forward, bubble, p2p ...) and anything else it reports (`extra`,
    merged into the point). Its memory per rank is its `Strategy.memory` (comm/memory.py), not priced here."""

    comm_exposed_s: float = 0.0
    comm: dict[str, Any] = field(default_factory=lambda: dict(NO_COMM))
    phases: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    flops_share: float = 1.0  # of the whole model's FLOPs, what one rank computes per step (a stage, a tile: less)


def link(s, network: dict[str, Any], kind: str) -> tuple[float, float]:
    """(alpha, beta) of the collective: the calibrated local fit inside one node; across nodes the slower
    of it and the declared inter-node link, whose latency adds to the software's."""
    intra = network["intra"].get(kind) or network["intra"].get("allreduce") or {"alpha_s": 0.0, "beta_s_per_byte": 0.0}
    alpha, beta = intra["alpha_s"], intra["beta_s_per_byte"]
    inter = network.get("inter")
    if s.nnodes > 1 and inter:
        alpha = alpha + inter["alpha_s"]
        beta = max(beta, inter["beta_s_per_byte"])
    return alpha, beta


def strategy_of(name: str):
    """The class of `--strategy name` (comm/registry.py), which prices itself (Strategy.cost)."""
    from scaletrain.comm.registry import strategy_class

    return strategy_class(name)


def ddp_buckets(pr: Pricing, fit: str, lanes: int = 1) -> Cost:
    """DDP's gradient buckets (perf/buckets.py): each reduced as soon as backward has filled it, `lanes` of them
    at once at most (perf/buckets.reductions), at the `fit` collective's alpha-beta over the trainers; what
    outlasts backward is exposed, and what hides behind it takes its CPU from backward where the cores are full
    (`Pricing.comm_cpu`)."""
    s = pr.setting
    grads = pr.grads
    if s.trainers < 2 or not grads:
        return Cost()
    # DDP's own host work (comm/ddp_host.py): each gradient copied into its bucket as backward produces it, every
    # reduced bucket copied back after the last reduction (exposed); none where the basis has no timing of it
    laws = (None, None) if "ddp_copies" in pr.without else (pr.host_law("copy_in_s"), pr.host_law("copy_out_s"))
    copy_in, copy_out = (law(len(grads), sum(grads) // 4) * pr.stretch if law is not None else 0.0 for law in laws)
    # gradients in the order backward produces them: ops in reverse, each op's as autograd accumulates them
    ready, sizes, elapsed = [], [], 0.0
    autocast = s.precision != "fp32"
    for op in reversed(pr.ops):
        elapsed += pr.loop.op_s(op, "backward") * pr.stretch
        for g in buckets.backward_order(op.kind, op.grad_bytes, autocast):
            ready.append(elapsed)
            sizes.append(g)
    bwd = pr.phases["backward"] + copy_in
    ready = [r * bwd / elapsed for r in ready] if elapsed > 0 else ready
    hooked = measured_codec(pr) if fit == "allreduce" else None
    if hooked:  # the compressed bucket's exchange as its hook ran it in the calibration, on the bucket's fp32 bytes
        comm_time = reduce_seconds(replace(s, compress=None), pr.exchange_link(hooked))
    else:
        comm_time = reduce_seconds(s, pr.exchange_link(fit), codec_seconds(pr))
    cpu = pr.comm_cpu(hooked or fit)
    result = buckets.backward_overlap(ready, sizes, comm_time, s.bucket_cap_mb, cpu, lanes)
    best_cap, best = buckets.best_bucket_cap(ready, sizes, comm_time, BUCKET_CAPS_MB, cpu, lanes)
    residual = pr.residual_s
    comm = {"bytes_per_step": sum(wire.ddp_bytes(b // 4, s.trainers, s.compress) for b in result["bucket_bytes"]),
            "buckets": len(result["buckets"]), "comm_total_s": result["comm_total_s"],
            "comm_hidden_s": result["comm_hidden_s"], "overlap_ratio": result["overlap_ratio"],
            "best_bucket_cap_mb": best_cap, "best_overlap_ratio": best["overlap_ratio"],
            "best_comm_exposed_s": best["comm_exposed_s"] + copy_out + residual,
            "host_copies_s": copy_in + copy_out, "compute_stolen_s": result["compute_stolen_s"], "residual_s": residual}
    apart = getattr(pr.predictor, "broadcast_apart", True)  # (a calibration may keep it inside its slowdown)
    broadcast = buffer_broadcast_s(s, pr.network, pr.without) if apart else 0.0
    comm["buffer_broadcast_s"] = broadcast
    return Cost(result["comm_exposed_s"] + copy_out + residual, comm,
                phases={"forward": pr.phases["forward"] + broadcast, "backward": bwd + result["compute_stolen_s"]})


def buffer_broadcast_s(s, network: dict[str, Any], without: frozenset[str] = frozenset()) -> float:
    """DDP's broadcast of the model's buffers from rank 0 at the start of every forward (`broadcast_buffers`, on by
    default: a batch norm's running statistics), in the forward phase: one collective between ranks that computed
    since the last one, at the basis's `halo` fit (commbench: a swap between computing ranks) where it has one, else
    its all-reduce fit; 0 for a model without buffers (and on a calibration basis that keeps it inside its slowdown
    ratio: Predictor.broadcast_apart). Measured (2026-11-29, two ranks of one thread, DDP with and
    without it alternated): 1.2 ms a forward for refnet at batch 2, 1.8-2.0 ms for ResNet-20 at 2 and 32, where
    the halo fit gave 1.8 and the all-reduce's 0.8."""
    if s.trainers < 2 or not s.buffer_bytes or "buffer_broadcast" in without:
        return 0.0
    alpha, beta = link(s, network, "halo" if "halo" in network.get("intra", {}) else "allreduce")
    return alpha + beta * s.buffer_bytes


def measured_codec(pr: Pricing) -> str | None:
    """The calibration's fit of a linear compressor's whole exchange (commbench's `fp16` / `bf16`: cast, all-reduce,
    cast back, as the hook runs them) where the point compresses so inside one node; None elsewhere (across nodes the
    payload crosses the declared link; a data sheet or a calibration before 2026-11-29 has no such fit)."""
    s = pr.setting
    name = s.compress[0] if s.compress else None
    if name not in ("fp16", "bf16") or s.nnodes > 1 or name not in pr.network.get("intra", {}):
        return None
    return name


def codec_seconds(pr: Pricing) -> Callable[[int], float] | None:
    """Seconds a bucket of `bytes` fp32 gradient bytes spends in fp16 compression's casts (the basis's
    `codec_s`), on the bucket's path like its exchange; None where no cast is priced (no compression, or a
    compressor whose own work the model does not price: top-k's selection, PowerSGD's factorisation)."""
    s = pr.setting
    if not s.compress or s.compress[0] != "fp16" or pr.predictor is None or not hasattr(pr.predictor, "codec_s"):
        return None
    return lambda nbytes: pr.predictor.codec_s(nbytes // 4, s.rank_threads)


def reduce_seconds(s, alpha_beta: tuple[float, float],
                   codec: Callable[[int], float] | None = None) -> Callable[[int], float]:
    """Seconds to reduce one bucket of `bytes` fp32 gradient bytes over the trainers (alpha-beta), compressed
    as --compress says: a linear compressor's payload all-reduced, another's all-gathered; with `codec`, plus
    the compressor's own seconds for the bucket."""
    alpha, beta = alpha_beta
    world = s.trainers

    def seconds(nbytes: int) -> float:
        if world < 2:
            return 0.0
        return _exchange(nbytes) + (codec(nbytes) if codec is not None else 0.0)

    def _exchange(nbytes: int) -> float:
        numel = nbytes // 4
        if wire.linear(s.compress):
            payload = wire.compressed_bytes(numel, s.compress) if s.compress and s.compress[0] != "powersgd" else \
                nbytes if not s.compress else nbytes // 8  # powersgd: factors, roughly rank/min(n,m) of it
            return alphabeta.predict(alpha, beta, world, payload)
        payload = wire.compressed_bytes(numel, s.compress)
        return (world - 1) * alpha + (world - 1) * payload * beta  # all-gathered
    return seconds
