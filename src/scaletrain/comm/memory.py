"""Memory per rank of a training request, for its layout (docs/perf.md, "Memory per rank, per layout").

The model is walked on the meta device (perf/footprint.model_memory: no memory, any image size) at the batch
the layout asks for; its strategy says what one rank of its layout holds (`Strategy.memory`: the whole model or
a shard or a stage, all activations or a tile's share); the dataset held in memory, the loader's batches and the
process itself are added here. The pre-flight check (`train --memory-per-device`), `predict --image-size max`
and the layouts named when a request does not fit all read it."""

from __future__ import annotations

import dataclasses
from typing import Callable

from scaletrain.comm.registry import strategy_class
from scaletrain.config import TrainConfig
from scaletrain.distributed.allocator import retained_below
from scaletrain.errors import UserError
from scaletrain.perf.footprint import Footprint, ModelMemory, dataset_bytes, model_memory, runtime_bytes

BATCH_COPIES = 2
"""Copies of one input batch a rank holds at once: the collated batch and the sample being loaded beside it."""


class _NoMeta(Exception):
    """The model cannot run on the meta device: no estimate."""


def per_rank(cfg: TrainConfig, factory: Callable, sample_shape: tuple[int, ...], device_type: str = "cpu",
             runtime: int | None = None) -> Footprint | None:
    """What one rank of `cfg`'s layout holds at its step's peak (the fullest rank); None when the model cannot run
    on the meta device. `runtime`: the process's own bytes (default: perf/footprint.runtime_bytes)."""
    checkpointed = cfg.model.checkpoint_activations == "blocks"
    # on a CPU, glibc keeps what is freed below its mmap threshold (distributed/allocator.py): its high-water stays
    retained = retained_below() if device_type == "cpu" else None
    cache: dict[int, ModelMemory | None] = {}

    def at(batch: int) -> ModelMemory:
        if batch not in cache:
            cache[batch] = model_memory(factory, batch, sample_shape, cfg.optim.optimizer, cfg.model.precision,
                                        checkpointed, retained)
        if cache[batch] is None:
            raise _NoMeta
        return cache[batch]

    try:
        part = strategy_class(cfg.strategy.name).memory(cfg, at, factory, sample_shape)
        batch = at(cfg.optim.batch_size).input_bytes
    except _NoMeta:
        return None
    return dataclasses.replace(part, dataset=dataset_bytes(cfg.data.dataset, sample_shape[-1], sample_shape[0]),
                               batches=BATCH_COPIES * batch,
                               runtime=runtime_bytes(device_type) if runtime is None else runtime)


def alternatives(cfg: TrainConfig) -> list[tuple[str, TrainConfig]]:
    """Other layouts of the same ranks that hold less per rank, each with the flags that ask for it: activation
    checkpointing, sharded parameters, a pipeline of every rank, every rank a tile of each image."""
    world = cfg.layout.world
    out: list[tuple[str, dict]] = [("--checkpoint-activations blocks", {"checkpoint_activations": "blocks"})]
    if world > 1:
        batch = max(cfg.optim.batch_size, world)  # a micro-batch per stage at least
        out += [("--strategy fsdp", {"strategy": "fsdp"}),
                (f"--strategy pipeline --nproc {world} --microbatches {world}"
                 + (f" --batch-size {batch}" if batch != cfg.optim.batch_size else ""),
                 {"strategy": "pipeline", "microbatches": world, "batch_size": batch}),
                (f"--strategy spatial --spatial {world}", {"strategy": "spatial", "spatial": world})]
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
        if need is not None and need.total <= budget:
            fits.append((flags, need.total))
    return sorted(fits, key=lambda f: f[1])
