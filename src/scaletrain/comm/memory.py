"""Memory per rank of a training request, for its layout (docs/perf.md, "Memory per rank, per layout").

The model is walked on the meta device (perf/footprint.model_memory: no memory, any image size) at the batch
the layout asks for; its strategy says what one rank of its layout holds (`Strategy.memory`: the whole model or
a shard or a stage, all activations or a tile's share); the dataset held in memory, the loader's batches and the
process itself are added here. The pre-flight check (`train --memory-per-device`), `predict --image-size max`
and the layouts named when a request does not fit all read it."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Callable

from scaletrain.comm.registry import strategy_class
from scaletrain.config import TrainConfig
from scaletrain.distributed.allocator import resolved, retained_below
from scaletrain.errors import UserError
from scaletrain.perf.footprint import (Footprint, ModelMemory, available_bytes, dataset_bytes, meta_model,
                                      model_blocks, model_memory, runtime_bytes)
from scaletrain.train.recompute import chosen

if TYPE_CHECKING:
    from torch.nn import Module

MARGIN = 0.10
"""What a plan must leave free of its budget: the model's error against measured peaks here is -9% to +12%
(docs/perf.md), so a plan within 90% of the budget trains within it."""


def within(total: int, budget: int) -> bool:
    """Whether a plan of `total` bytes per rank fits `budget`, with MARGIN kept free."""
    return total * (1 + MARGIN) <= budget


BATCH_COPIES = 2
"""Copies of one input batch a rank holds at once: the collated batch and the sample being loaded beside it."""


class _NoMeta(Exception):
    """The model cannot run on the meta device: no estimate."""


def per_rank(cfg: TrainConfig, factory: Callable, sample_shape: tuple[int, ...], device_type: str = "cpu",
             runtime: int | None = None, cache: dict | None = None) -> Footprint | None:
    """What one rank of `cfg`'s layout holds at its step's peak (the fullest rank); None when the model cannot run
    on the meta device. `runtime`: the process's own bytes (default: perf/footprint.runtime_bytes); `cache`:
    the model's walks, kept between calls on the same model."""
    cache = {} if cache is None else cache
    try:
        at, extra = _walks(cfg, factory, sample_shape, device_type, runtime, cache)
        # a layout's part, once per configuration: the loader's workers are processes of their own (their batches
        # are `extra`'s), so a plan's candidates that differ in workers alone share it (a pipeline's split search
        # for its fullest stage is a third of a second)
        key = ("layout", workerless(cfg), sample_shape, device_type, extra.runtime)
        if key not in cache:
            cache[key] = strategy_class(cfg.strategy.name).memory(cfg, at, _kept_model(cache, factory, sample_shape),
                                                                  sample_shape)
        part = cache[key]
    except _NoMeta:
        return None
    return dataclasses.replace(part, dataset=extra.dataset, batches=extra.batches, runtime=extra.runtime)


def workerless(cfg: TrainConfig) -> str:
    """A key of `cfg` with its loader workers left out (their count and persistence): configurations that differ in
    them alone share a layout's memory part and a pipeline's pricing. (Its sections, never a new configuration: one
    with persistent workers and none would be refused, and each configuration made checks every setting.)"""
    data = dataclasses.replace(cfg.data, workers=0, persistent_workers=False)
    return repr(tuple(data if section is cfg.data else section for section in cfg.sections()))


def kept_meta_model(cache: dict, factory: Callable, sample_shape: tuple[int, ...]) -> Module | None:
    """The model on the meta device, built once per `cache` (cached_walk's, whose walks run it): what a layout's
    memory or cost reads of the model (its front, its units), never a model to train; None where it cannot be."""
    key = ("model", sample_shape)
    if key not in cache:
        cache[key] = meta_model(factory)
    return cache[key]


def _kept_model(cache: dict, factory: Callable, sample_shape: tuple[int, ...]) -> Callable:
    def model():
        built = kept_meta_model(cache, factory, sample_shape)
        if built is None:
            raise _NoMeta
        return built

    return model


def stage_memory(cfg: TrainConfig, factory: Callable, sample_shape: tuple[int, ...], batch: int,
                 device_type: str) -> ModelMemory | None:
    """The model's ModelMemory at a pipeline's micro-batch `batch`, with the room its stages may take (what a
    running pipeline splits within: comm/pipeline/strategy.py); None when the model cannot run on the meta device."""
    try:
        at, _ = _walks(cfg, factory, sample_shape, device_type, None, None)
        return at(batch)
    except _NoMeta:
        return None


def _walks(cfg: TrainConfig, factory: Callable, sample_shape: tuple[int, ...], device_type: str,
           runtime: int | None, cache: dict | None) -> tuple[Callable[[int], ModelMemory], Footprint]:
    """(the model's ModelMemory at a batch, with cfg's checkpointing and its room; what a rank holds beside its
    layout's part: the dataset, the loader's batches, the process). _NoMeta when the model cannot run on meta."""
    checkpointed = chosen(cfg.model.checkpoint_activations)
    # on a CPU, glibc keeps what is freed below its mmap threshold (distributed/allocator.py): its high-water stays
    policy = resolved(cfg.launch.allocator, bool(cfg.launch.memory_per_device), device_type)
    retained = retained_below(policy) if policy else None
    cache = {} if cache is None else cache

    def walked(batch: int) -> ModelMemory:
        mm = cached_walk(cache, factory, batch, sample_shape, cfg.optim.optimizer, cfg.model.precision, retained)
        if mm is None:
            raise _NoMeta
        return mm

    extra = Footprint(dataset=dataset_bytes(cfg.data.dataset, sample_shape[-1], sample_shape[0]),
                      batches=BATCH_COPIES * walked(cfg.optim.batch_size).input_bytes,
                      runtime=runtime_bytes(device_type, policy) if runtime is None else runtime)
    room = room_for(cfg, extra)

    def at(batch: int) -> ModelMemory:
        return dataclasses.replace(walked(batch), checkpointed=checkpointed, room=room)

    return at, extra


def cached_walk(cache: dict, factory: Callable, batch: int, sample_shape: tuple[int, ...], optimizer: str,
                precision: str, retained: int | None = None) -> ModelMemory | None:
    """perf/footprint.model_memory of the model at `batch`, kept in `cache` (one model's walks) for the next call;
    the walk itself once per batch and shape, whatever the optimizer, precision and allocator."""
    key = (batch, sample_shape, optimizer, precision, retained)
    if key not in cache:
        traced = ("walk", batch, sample_shape)
        if traced not in cache:
            model = kept_meta_model(cache, factory, sample_shape)  # once for every batch (a ResNet-50's init: 0.1 s)
            cache[traced] = None if model is None else model_blocks(factory, batch, sample_shape, model)
        cache[key] = None if cache[traced] is None else model_memory(
            factory, batch, sample_shape, optimizer, precision, retained_below=retained, walked=cache[traced])
    return cache[key]


def room_for(cfg: TrainConfig, extra: Footprint) -> int | None:
    """What a rank may give its layout's part under --memory-per-device: the budget less MARGIN and the `extra`
    (the dataset, the batches, the process); None without a budget."""
    if not cfg.launch.memory_per_device:
        return None
    from scaletrain.units import size_flag

    return int(size_flag(cfg.launch.memory_per_device, "--memory-per-device") / (1 + MARGIN)) - extra.total


def alternatives(cfg: TrainConfig) -> list[tuple[str, TrainConfig]]:
    """Other layouts of the same ranks that hold less per rank, each with the flags that ask for it: activation
    checkpointing, sharded parameters, a pipeline of every rank, every rank a tile of each image, (4 ranks or more)
    half as many tiles in 2 pipeline stages."""
    world = cfg.layout.world
    out: list[tuple[str, dict]] = [("--checkpoint-activations blocks", {"checkpoint_activations": "blocks"})]
    if world > 1:
        batch = max(cfg.optim.batch_size, world)  # a micro-batch per stage at least
        out += [("--strategy fsdp", {"strategy": "fsdp"}),
                (f"--strategy pipeline --nproc {world} --microbatches {world}"
                 + (f" --batch-size {batch}" if batch != cfg.optim.batch_size else ""),
                 {"strategy": "pipeline", "microbatches": world, "batch_size": batch}),
                (f"--strategy spatial --spatial {world}", {"strategy": "spatial", "spatial": world})]
        if world >= 4 and world % 2 == 0:  # half the ranks' tiles, in 2 pipeline stages
            pair = max(cfg.optim.batch_size, 2)
            out.append((f"--strategy spatial --spatial {world // 2} --stages 2 --microbatches 2"
                        + (f" --batch-size {pair}" if pair != cfg.optim.batch_size else ""),
                        {"strategy": "spatial", "spatial": world // 2, "stages": 2, "microbatches": 2,
                         "batch_size": pair}))
        out += [(f"{flags} --checkpoint-activations blocks", {**change, "checkpoint_activations": "blocks"})
                for flags, change in out[1:]]
    made = []
    for flags, change in out:
        try:
            made.append((flags, cfg.replace(**change)))
        except UserError:  # a layout these ranks cannot take (e.g. a spatial grid): not an alternative
            continue
    return made


def fitting(cfg: TrainConfig, factory: Callable, sample_shape: tuple[int, ...], budget: int, device_type: str,
            runtime: int) -> list[tuple[str, int]]:
    """The alternatives (flags, bytes per rank) whose ranks hold at most `budget`, least memory first."""
    fits = []
    for flags, other in alternatives(cfg):
        if other.to_dict() == cfg.to_dict():
            continue
        try:  # (a layout these ranks cannot take refuses in its memory: a tile grid, more stages than blocks)
            need = per_rank(other, factory, sample_shape, device_type, runtime)
        except UserError:
            continue
        if need is not None and within(need.total, budget):
            fits.append((flags, need.total))
    return sorted(fits, key=lambda f: f[1])


def budget_of(cfg: TrainConfig, device_type: str) -> int | None:
    """Bytes one rank may use: --memory-per-device, else the GPU's, else the host's total memory shared by the
    node's ranks (total, not available: every process that plans gets the same)."""
    from scaletrain.units import size_flag

    if cfg.launch.memory_per_device:
        return size_flag(cfg.launch.memory_per_device, "--memory-per-device")
    if device_type == "cuda":
        return available_bytes("cuda")
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // max(1, cfg.launch.nproc)
    except (ValueError, OSError, AttributeError):
        return None


def resolve_checkpointing(cfg: TrainConfig, factory: Callable, sample_shape: tuple[int, ...],
                          device_type: str, cache: dict | None = None) -> TrainConfig:
    """`--checkpoint-activations auto` as the blocks it checkpoints: none when the plan fits the budget
    (budget_of), else the fewest blocks, those saving the most first, that bring it within (all of them when
    nothing does: the budget check then says so). Other values come back as they are. `cache`: the model's
    walks, kept between calls on the same model (as per_rank's)."""
    if cfg.model.checkpoint_activations != "auto":
        return cfg
    cache = {} if cache is None else cache
    # what a rank holds does not depend on its loader workers (per_rank): the answer is kept without them
    key = ("checkpointing", workerless(cfg), sample_shape, device_type)
    if key not in cache:
        cache[key] = _checkpointed(cfg, factory, sample_shape, device_type, cache)
    return cfg.replace(checkpoint_activations=cache[key])


def _checkpointed(cfg: TrainConfig, factory: Callable, sample_shape: tuple[int, ...], device_type: str,
                  cache: dict) -> str:
    budget = budget_of(cfg, device_type)

    def need(value: str) -> int | None:
        f = per_rank(cfg.replace(checkpoint_activations=value), factory, sample_shape, device_type, cache=cache)
        return None if f is None else f.total

    plain = need("none")
    if plain is None or budget is None or within(plain, budget):
        return "none" if plain is not None else "blocks"
    mm = _walks(cfg, factory, sample_shape, device_type, None, cache)[0](cfg.optim.batch_size)
    order = sorted(mm.blocks, key=lambda b: b.input - b.saved)  # the largest saving first
    names: list[str] = []
    for b in order:
        names.append(b.name)
        total = need(",".join(names))
        if total is not None and within(total, budget):
            break
    return ",".join(n for n in (b.name for b in mm.blocks) if n in names)
