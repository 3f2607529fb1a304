"""From run settings to predicted points: trace the model, price its ops with the calibration, apply the
model (model.py) and name each point's limit and the scaling's (docs/predict.md)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import statistics
from typing import Any

import torch


from scaletrain.errors import UserError
from scaletrain.predict import model as M
from scaletrain.predict.kept import Kept
from scaletrain.predict.ops import Workload
from scaletrain.predict.predictor import LARGE_BATCH, Predictor, cal_workload

NO_MEMORY_NOTE = "memory per rank not estimated: the model cannot run on the meta device (its walk needs real tensors)"
LEAN_NOTE = ("the CPU allocator runs lean (--allocator lean, or auto with --memory-per-device): its steps are slower "
             "than priced (0.66-0.83x the steady policy's samples/s measured here, docs/perf.md)")
AUTO_CAP_NOTE = ("--bucket-cap-mb auto: each point priced at the bucket cap auto would choose there "
                 "(comm.best_bucket_cap_mb; DDP's default when none is better)")

@functools.lru_cache(maxsize=64)
def _cached_workload(model_name: str, num_classes: int, in_channels: int, image_size: int, batch: int, stem: str,
                     width: float) -> Workload:
    """The model's ops at `batch`, traced on meta tensors (shapes and FLOPs, no memory: any image size and
    batch); a model that cannot be built or run on the meta device is traced on the CPU, its memory checked
    first."""
    from scaletrain.models.registry import build_model, meta_model

    shape = (in_channels, image_size, image_size)
    try:  # (one meta model for every batch: its walks kept, perf/walk.layer_graph)
        return cal_workload(meta_model(model_name, num_classes=num_classes, in_channels=in_channels,
                                       image_size=image_size, stem=stem, width=width), shape, batch)
    except Exception:  # a model that makes its own CPU tensors, or data-dependent code: a real forward pass
        _check_trace_memory(model_name, num_classes, in_channels, image_size, batch, stem, width)
        with torch.device("cpu"):
            model = build_model(model_name, num_classes=num_classes, in_channels=in_channels, image_size=image_size,
                                stem=stem, width=width)
        return cal_workload(model, shape, batch)


def workload(cfg, data_facts: dict[str, Any], batch: int) -> Workload:
    return _cached_workload(cfg.model.name, data_facts["classes"], data_facts["channels"], data_facts["image_size"],
                            batch, cfg.model.stem, cfg.model.width)


@functools.lru_cache(maxsize=32)
def data_facts(dataset: str, image_size: int | None, synthetic_samples: int, synthetic_classes: int,
               augment: bool = True) -> dict[str, Any]:
    """Samples, classes, channels, image size and (image folders) the images' mean source pixels as the training
    transform decodes them: a JPEG larger than it needs is decoded at 1/2, 1/4 or 1/8 of its size
    (data/imagefolder.reduced), which `--no-augment`'s resize allows far more often than a random crop's."""
    from scaletrain.data.imagefolder import reduced
    from scaletrain.data.registry import build_datasets

    bundle = build_datasets(dataset, image_size=image_size, synthetic_samples=synthetic_samples,
                            synthetic_classes=synthetic_classes, augment=augment)
    facts = {"samples": len(bundle.train), "classes": bundle.num_classes, "channels": bundle.in_channels,
             "image_size": bundle.image_size, "source_pixels": None}
    if dataset.startswith("imagefolder:"):
        from PIL import Image

        train = bundle.train
        picks = range(0, len(train), max(1, len(train) // 16))
        sizes = []
        for i in picks:
            with Image.open(train.path(i)) as im:
                reduced(im, train.transform)
                sizes.append(im.size[0] * im.size[1])
        facts["source_pixels"] = int(statistics.fmean(sizes)) if sizes else None
    return facts


def trainers(cfg) -> int:
    """Ranks that read different data and share the global batch (the layout's replicas), at least 1."""
    return max(1, cfg.layout.replicas)


def check_point(cfg, hw=None) -> None:
    """Refuse, before a calibration is read or a model traced, a point the model cannot price, the data cannot
    fill or this machine cannot trace: one UserError line."""
    from scaletrain.comm.spec import parse_compress

    from scaletrain.comm.registry import strategy_class

    if not strategy_class(cfg.strategy.name).priced:
        raise UserError(f"--strategy {cfg.strategy.name}: predict does not price it yet; measure it with "
                        "scaletrain train (or a study), or predict another strategy")
    compress = parse_compress(cfg.strategy.compress)
    if compress and compress[0] == "powersgd":
        raise UserError(f"--compress {cfg.strategy.compress}: predict cannot price PowerSGD (its bytes depend on each "
                        "gradient's shape, which the model does not keep yet): predict another --compress, or "
                        "measure PowerSGD with scaletrain train")
    if hw is not None and hw.kind == "cuda" and cfg.launch.nproc > hw.count:
        raise UserError(f"--nproc {cfg.launch.nproc}: a {hw.name} node has {hw.count} GPUs, one process each: give "
                        f"--nproc {hw.count} or fewer per node (and more --nnodes)")
    if cfg.layout.replicas < 1:
        raise UserError(f"--nproc {cfg.launch.nproc} x --nnodes {cfg.launch.nnodes} leaves no trainer (a rank that "
                        f"reads data) for --strategy {cfg.strategy.name}: give more processes, or fewer --stages or "
                        "--ps-servers")
    cfg.check_launch()  # what the launcher refuses of the job's shape (a pipeline with fewer micro-batches than stages)
    facts = data_facts(cfg.data.dataset, cfg.data.image_size, cfg.data.synthetic_samples, cfg.data.synthetic_classes,
                       cfg.data.augment)
    if cfg.optim.batch_size * trainers(cfg) > facts["samples"]:
        raise UserError(f"--batch-size {cfg.optim.batch_size} x {trainers(cfg)} trainers (--nproc {cfg.launch.nproc} "
                        f"x --nnodes {cfg.launch.nnodes}) is more than the {facts['samples']} training samples: an "
                        "epoch would have no step; lower --batch-size, --nproc or --nnodes")


@functools.lru_cache(maxsize=64)
def _check_trace_memory(model_name: str, num_classes: int, in_channels: int, image_size: int, batch: int, stem: str,
                        width: float) -> None:
    """A model that only a real forward pass can trace: refuse a batch whose forward cannot fit here."""
    from scaletrain.models.registry import build_model
    from scaletrain.perf.footprint import check_forward_fits

    check_forward_fits(lambda: build_model(model_name, num_classes=num_classes, in_channels=in_channels,
                                           image_size=image_size, stem=stem, width=width),
                       batch, in_channels, image_size,
                       f"tracing {model_name} (it cannot run on meta tensors) at a batch of {batch} and "
                       f"--image-size {image_size}", "lower --batch-size or --image-size")


def _setting(p: Predictor, cfg, facts: dict[str, Any], shared_cores: int | None, cores: int | None) -> M.Setting:
    from scaletrain.comm.spec import parse_compress

    auto_cap = cfg.strategy.bucket_cap_mb == "auto"
    cores = cores or p.cores
    return M.Setting(batch_size=cfg.optim.batch_size, precision=cfg.model.precision, nproc=cfg.launch.nproc,
                     nnodes=cfg.launch.nnodes, workers=cfg.data.workers, strategy=cfg.strategy.name,
                     compress=parse_compress(cfg.strategy.compress),
                     servers=cfg.layout.servers, bucket_cap_mb=None if auto_cap else cfg.strategy.bucket_cap_mb,
                     optimizer=cfg.optim.optimizer, cores=cores,
                     shared_cores=shared_cores, threads=cfg.launch.threads, train_samples=facts["samples"],
                     cpu_compute=p.hardware is None or p.hardware.kind == "cpu", stages=cfg.layout.stages,
                     tiles=cfg.layout.tiles,
                     stretch="core_stretch" not in p.without)


def _loop(p: Predictor, cfg, s: M.Setting, shared_cores: int | None):
    # the loop of as many computing ranks on a node as the layout has (a parameter server waits while its workers
    # compute: ps-sync on 2 ranks computes as one rank alone); a testbed's hosts as launched
    return p.loop(cfg.launch.nproc if shared_cores else max(1, round(s.layout.trainers / max(1, s.nnodes))))


def epoch_floor_s(p: Predictor, cfg, *, shared_cores: int | None = None, cores: int | None = None) -> float | None:
    """A lower bound on the point's predicted epoch: its steps times the whole model's forward and backward
    (model.compute_s), where its strategy runs the whole model on every trainer and only adds to that
    (Strategy.computes_whole_model), else times the strategy's own bound on its step (Strategy.step_floor_s: a
    pipeline's blocks over its stages); None where it has none. A few milliseconds where predict_config takes tens:
    what a plan prunes by (plan/search.py)."""
    from scaletrain.comm.memory import workerless
    from scaletrain.comm.registry import strategy_class

    check_point(cfg, p.hardware)
    strategy = strategy_class(cfg.strategy.name)

    def floor() -> float | None:
        facts = _facts(cfg)
        s = _setting(p, cfg, facts, shared_cores, cores)
        if strategy.computes_whole_model:
            w = workload(cfg, facts, cfg.optim.batch_size)
            ops = p.op_costs(w, cfg.model.precision, s.rank_threads)
            loss = p.loss_s(cfg.optim.batch_size, facts["classes"], cfg.model.precision, s.rank_threads)
            step = sum(M.compute_s(ops, s, _loop(p, cfg, s, shared_cores), loss))  # (a recompute only adds)
        else:
            step = strategy.step_floor_s(cfg, facts, p, s.rank_threads)
            if step is None:
                return None
        return facts["samples"] // (cfg.optim.batch_size * s.trainers) * step

    return _KEPT.get((p,), ("floor", workerless(cfg), shared_cores, cores), floor)


def predict_config(p: Predictor, cfg, *, shared_cores: int | None = None, cores: int | None = None) -> dict[str, Any]:
    """One point: the model's phases, epoch, memory and limit for a TrainConfig (its batch per rank). What its
    loader workers change nothing of (the strategy's step, memory, ops) is kept per basis for the configuration
    without them: a plan's candidates that differ in workers alone price it once."""
    from scaletrain.comm.memory import workerless

    check_point(cfg, p.hardware)
    base = _KEPT.get((p,), ("point", workerless(cfg), shared_cores, cores),
                     lambda: _before_input(p, cfg, shared_cores, cores))
    s = dataclasses.replace(base.setting, workers=cfg.data.workers)
    step = M.with_input(base.step, s, p.workers())
    facts, mem = base.facts, base.memory
    steps = facts["samples"] // (cfg.optim.batch_size * s.trainers)
    lim, note = M.limit(step["phases_s"], base.efficiency)
    peak = sum(mem.values()) if mem else None
    check = plausibility(base.workload, step["phases_s"], p.peak_flops(cfg.model.precision), steps, p.hardware,
                         peak or 0, p.device_memory(), oversubscribed(s), step["flops_share"])
    return {"setting": s, "phases_s": step["phases_s"], "step_time_s": step["step_time_s"],
            "steps_per_epoch": steps, "epoch_time_s": steps * step["step_time_s"] + step["epoch_start_s"],
            "samples_per_s": cfg.optim.batch_size * s.trainers / step["step_time_s"],
            "peak_memory_bytes": peak, "memory_bytes": dict(mem), "memory_kind": p.memory_kind(),
            "comm": dict(step["comm"]), "layers": dict(base.layers), "limit": lim, "limit_note": note,
            "batch_efficiency": base.efficiency, "threads": s.rank_threads, "stretch": step["stretch"],
            "workers_lost_s": step["workers_lost_s"], "plausibility": check, "notes": list(base.notes),
            "image_size": facts["image_size"], "ops": [dict(o) for o in base.per_op], **copy.deepcopy(step["extra"])}


@dataclasses.dataclass(frozen=True)
class _BeforeInput:
    """A point's pricing up to its input (predict_config): what its loader workers change nothing of."""

    setting: M.Setting  # (its workers the first point's: predict_config gives each point its own)
    facts: dict[str, Any]
    workload: Workload
    step: dict[str, Any]  # model.strategy_step's
    memory: dict[str, int]
    efficiency: float
    layers: dict[str, int]
    per_op: list[dict[str, Any]]
    notes: list[str]


def _facts(cfg) -> dict[str, Any]:
    return data_facts(cfg.data.dataset, cfg.data.image_size, cfg.data.synthetic_samples, cfg.data.synthetic_classes,
                      cfg.data.augment)


def _before_input(p: Predictor, cfg, shared_cores: int | None, cores: int | None) -> _BeforeInput:
    auto_cap = cfg.strategy.bucket_cap_mb == "auto"
    facts = _facts(cfg)
    s = _setting(p, cfg, facts, shared_cores, cores)
    w = workload(cfg, facts, cfg.optim.batch_size)
    s.buffer_bytes = w.buffer_bytes
    threads = s.rank_threads
    ops = [dataclasses.replace(c, name=op.name) for op, c in zip(w.ops, p.op_costs(w, cfg.model.precision, threads))]
    again = recomputed_share(cfg, facts)
    if again:  # activation checkpointing: that share of the forward runs again in backward
        ops = [dataclasses.replace(o, backward_s=o.backward_s + again * o.forward_s) for o in ops]
    loss = p.loss_s(cfg.optim.batch_size, facts["classes"], cfg.model.precision, threads)
    s.sample_s = p.loader_sample_s(cfg.data.dataset, facts["image_size"], facts["source_pixels"], cfg.optim.batch_size)
    # the batch as the loader makes it (float32 images, int64 labels), copied to the device before its forward
    copy_bytes = cfg.optim.batch_size * (4 * math.prod(sample_shape(facts)) + 8)
    loop = _loop(p, cfg, s, shared_cores)
    loop = dataclasses.replace(loop, h2d_s=loop.h2d_s + p.batch_copy_s(copy_bytes))
    s.data_line = (loop.data_factor, loop.data_s)
    opt_law = p.optimizer_law(cfg.optim.optimizer, threads)

    def step_at(setting: M.Setting) -> dict[str, Any]:
        return M.strategy_step(ops, setting, loop, p.network, opt_law, loss, cfg=cfg, facts=facts, predictor=p)

    step = step_at(s)
    if auto_cap and step["comm"].get("best_bucket_cap_mb") is not None:
        # --bucket-cap-mb auto: the cap the model finds best at this point, as auto_bucket.choose picks it
        s.bucket_cap_mb = step["comm"]["best_bucket_cap_mb"]
        step = step_at(s)
    mem = rank_memory(cfg, facts, p.memory_kind())  # (after the strategy's cost: its refusal names the basis)
    per_op = [{"name": op.name, "kind": op.kind, "source": c.source, "forward_s": c.forward_s,
               "backward_s": c.backward_s} for op, c in zip(w.ops, ops) if op.kind != "view"]
    sources: dict[str, int] = {}
    for o in ops:
        if o.source != "none":
            sources[o.source] = sources.get(o.source, 0) + 1
    notes = list(w.notes) + ([AUTO_CAP_NOTE] if auto_cap else []) + ([] if mem else [NO_MEMORY_NOTE]) \
        + ([LEAN_NOTE] if runs_lean(cfg, p.memory_kind()) else [])
    return _BeforeInput(s, facts, w, step, mem, batch_efficiency(p, cfg, facts, ops, threads),
                        {k: sources.get(k, 0) for k in ("measured", "regression", "roofline")}, per_op, notes)


_KEPT = Kept(512)  # (a plan's largest grid holds 60 configurations without workers; each entry ~60 kB)


def checkpointing(cfg, facts: dict[str, Any]) -> str:
    """The point's --checkpoint-activations as the launcher resolves it (`auto`: the blocks that bring the layout
    within its budget, comm/memory.resolve_checkpointing, on the model's walks kept for the process)."""
    if cfg.model.checkpoint_activations != "auto":
        return cfg.model.checkpoint_activations
    from scaletrain.comm.memory import resolve_checkpointing

    return resolve_checkpointing(cfg, model_factory(cfg, facts), sample_shape(facts), "cpu",
                                 cache=_model_walks(cfg, facts)).model.checkpoint_activations


def recomputed_share(cfg, facts: dict[str, Any]) -> float:
    """The share of the forward that activation checkpointing runs again in backward: the checkpointed blocks'
    forward FLOPs over the model's (the block graph on meta tensors; `auto` as the launcher would resolve it).
    The model's walks are kept for the process (a sweep, a plan, walks each model once)."""
    value = checkpointing(cfg, facts)
    if value == "none":
        return 0.0
    from scaletrain.comm.memory import cached_walk
    from scaletrain.train.recompute import block_units, pick_units

    factory, shape = model_factory(cfg, facts), sample_shape(facts)
    walks = _model_walks(cfg, facts)
    mm = cached_walk(walks, factory, 1, shape, cfg.optim.optimizer, cfg.model.precision)
    if mm is None:
        return 0.0
    key = (_model_key(cfg, facts), shape)
    if key not in _UNITS:
        with torch.device("meta"):
            _UNITS[key] = block_units(factory(), shape)
    recomputed = {u.block for u in pick_units(*_UNITS[key], value)}  # (a lone layer, e.g. fc, is not)
    total = sum(b.flops for b in mm.blocks)
    return sum(b.flops for b in mm.blocks if b.name in recomputed) / total if total else 0.0


def runs_lean(cfg, memory_kind: str) -> bool:
    """Whether the point's run takes the lean allocator policy (a CPU run; distributed/allocator.resolved)."""
    from scaletrain.distributed.allocator import resolved

    return memory_kind != "cuda" and resolved(cfg.launch.allocator, bool(cfg.launch.memory_per_device), "cpu") == "lean"


def model_factory(cfg, facts: dict[str, Any]):
    """A function that builds the point's model (on whatever device is current)."""
    from scaletrain.models.registry import build_model

    def factory():
        return build_model(cfg.model.name, num_classes=facts["classes"], in_channels=facts["channels"],
                           image_size=facts["image_size"], stem=cfg.model.stem, width=cfg.model.width)

    return factory


def sample_shape(facts: dict[str, Any]) -> tuple[int, int, int]:
    return facts["channels"], facts["image_size"], facts["image_size"]


_WALKS: dict[tuple, dict] = {}  # the model's memory walks per model, kept for the process (a sweep walks once)
_UNITS: dict[tuple, tuple] = {}  # the units of the model's blocks and their names, per model and shape


def _model_key(cfg, facts: dict[str, Any]) -> tuple:
    return cfg.model.name, cfg.model.stem, cfg.model.width, facts["classes"], facts["channels"]


def meta_model_of(cfg, facts: dict[str, Any]):
    """The point's model on the meta device, kept with its walks for the process (read it, never train it); None
    where it cannot be built there."""
    from scaletrain.comm.memory import kept_meta_model

    return kept_meta_model(_model_walks(cfg, facts), model_factory(cfg, facts), sample_shape(facts))


def _model_walks(cfg, facts: dict[str, Any]) -> dict:
    """The walks of the point's model kept for the process (comm/memory.cached_walk's cache)."""
    return _WALKS.setdefault(_model_key(cfg, facts), {})


def rank_memory(cfg, facts: dict[str, Any], memory_kind: str) -> dict[str, int]:
    """Bytes one rank of the point's layout holds at its step's peak, by part: the one memory model that the
    pre-flight check and `--image-size max` read (comm/memory.per_rank: the strategy's layout, the allocator's
    retained heap on a CPU, the dataset, the loader's batches, the process); {} when the model cannot run on the
    meta device."""
    from scaletrain.comm.memory import per_rank

    device = "cuda" if memory_kind == "cuda" else "cpu"
    fp = per_rank(cfg, model_factory(cfg, facts), sample_shape(facts), device, cache=_model_walks(cfg, facts))
    return {} if fp is None else dataclasses.asdict(fp)


def batch_efficiency(p: Predictor, cfg, facts, ops: list[M.OpCost], threads: int) -> float:
    """Per-sample compute at this batch against at LARGE_BATCH (1 = the batch is large enough)."""
    if cfg.optim.batch_size >= LARGE_BATCH:
        return 1.0
    big = workload(cfg, facts, LARGE_BATCH)
    big_ops = p.op_costs(big, cfg.model.precision, threads)
    small = sum(o.forward_s + o.backward_s for o in ops) / cfg.optim.batch_size
    large = sum(o.forward_s + o.backward_s for o in big_ops) / LARGE_BATCH
    return min(1.0, large / small) if small > 0 else 1.0


def oversubscribed(s: M.Setting) -> tuple[int, int] | None:
    """(threads, cores) when the ranks' intra-op thread teams on a node's CPU cores (every host's, for testbed
    hosts sharing a machine) are more than its cores; None otherwise, on an accelerator, or with one thread per
    rank (processes of one thread share cores by time slices: the stretch prices that)."""
    if not s.cpu_compute or s.rank_threads < 2:
        return None
    threads = s.nproc * s.rank_threads * (s.nnodes if s.shared_cores else 1)
    cores = s.shared_cores or s.cores
    return (threads, cores) if threads > cores else None


PLAUSIBLE = (0.01, 1.0)  # the fractions of the peak FLOP rate a step's forward + backward may imply


def plausibility(w: Workload, phases: dict[str, float], peak: float | None, steps_per_epoch: int,
                 hardware, memory_bytes: int = 0, device_bytes: int | None = None,
                 oversubscription: tuple[int, int] | None = None, share: float = 1.0) -> dict[str, Any]:
    """The FLOP rate the predicted forward + backward imply against the device's peak (a data sheet's, or
    the fastest op the calibration measured), and a flag with its likely cause when the point is outside
    PLAUSIBLE, an epoch holds no full step or a rank's memory is more than its device has. `share`: of the model's
    FLOPs, what one rank computes (Cost.flops_share: a pipeline's mean stage, a tile's front)."""
    flops = share * sum(op.flops * (2 + int(op.needs_input_grad)) for op in w.ops)  # forward, weight and input grads
    seconds = phases["forward"] + phases["backward"]
    rate = flops / seconds if seconds > 0 else 0.0
    fraction = rate / peak if peak else None
    of = "the device's data-sheet peak" if hardware is not None else "the fastest op this calibration measured"
    flag = None
    if device_bytes and memory_bytes > device_bytes:
        flag = (f"a rank needs {memory_bytes / 2**30:,.1f} GiB, more than the device's {device_bytes / 2**30:,.1f} "
                "GiB: it would not run (lower --batch-size or --image-size, or split the model)")
    elif steps_per_epoch < 1:
        flag = "an epoch holds no full step: the dataset has fewer samples than one global batch"
    elif oversubscription is not None:
        threads, cores = oversubscription
        flag = (f"{threads} intra-op threads on {cores} cores: oversubscribed thread teams wait on each other at "
                "every barrier, which the stretch by threads / cores does not price (2 ranks x 2 threads on 2 "
                "cores ran 2-16x slower than it here): the step time is a floor; give --threads cores / ranks")
    elif fraction is not None and fraction > PLAUSIBLE[1]:
        cause = ("the profile's peak or efficiencies are wrong" if hardware is not None else
                 "the calibration's laws are used far outside the shapes it measured")
        flag = f"forward + backward imply {rate / 1e12:.3g} TFLOP/s, {fraction:.0%} of {of}: impossible; {cause}"
    elif fraction is not None and flops > 0 and fraction < PLAUSIBLE[0]:
        flag = (f"forward + backward imply {rate / 1e12:.3g} TFLOP/s, {fraction:.2%} of {of}: the device would sit "
                "almost idle (per-op overheads dominate: a batch or model this small cannot use it)")
    return {"flop_rate": rate, "peak_flops": peak, "fraction_of_peak": fraction, "flag": flag}
