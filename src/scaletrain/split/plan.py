"""What a pipeline needs from the split: the stage bounds for `--split auto|uniform|params|time|FILE`, a split
file read back for the model it was made for, and the split.json `scaletrain split` writes (docs/split.md)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from torch import nn

from scaletrain.errors import UserError
from scaletrain.rundir import SPLIT
from scaletrain.split.costs import block_costs, block_sizes
from scaletrain.split.partition import (BASELINES, BlockCost, Bounds, Partition, StageMemory, check_memory, evaluate,
                                        optimal)
from scaletrain.split.stages import Blocked, check_bounds

METHODS = ("auto", "uniform", "params", "time")  # or a path to a split.json
DEFAULT_LINK = 10e9 / 8  # 10 Gbit/s in bytes per second, when neither --link nor a calibration says


def micro_batch(batch_size: int, microbatches: int) -> int:
    """Samples per micro-batch; the global batch must split evenly."""
    if microbatches < 1:
        raise UserError(f"--microbatches {microbatches}: give at least 1")
    if batch_size < 1 or batch_size % microbatches:
        raise UserError(f"--microbatches {microbatches} does not divide --batch-size {batch_size}: pick a batch "
                        f"that is a multiple of it (e.g. {microbatches * max(1, batch_size // microbatches)})")
    return batch_size // microbatches


def pipeline_args(*, microbatches: int, schedule: str, optimizer: str = "sgd",
                  link_bytes_per_s: float = DEFAULT_LINK, latency_s: float = 0.0, memory_limit: int | None = None,
                  offload_bytes_per_s: float | None = None, memory: StageMemory | None = None) -> dict[str, Any]:
    """The keywords partition.py's functions take, from training's terms; `memory`: the stages by the memory model
    (stage_memory)."""
    from scaletrain.perf.memory import OPTIMIZER_STATE

    if optimizer not in OPTIMIZER_STATE:
        raise UserError(f"optimizer {optimizer!r}: use one of {', '.join(OPTIMIZER_STATE)}")
    return {"microbatches": microbatches, "schedule": schedule, "link_bytes_per_s": link_bytes_per_s,
            "latency_s": latency_s, "state_copies": OPTIMIZER_STATE[optimizer], "memory_limit": memory_limit,
            "offload_bytes_per_s": offload_bytes_per_s, "memory": memory}


def stage_memory(factory: Callable[[], nn.Module], blocked: Blocked, input_shape: tuple[int, ...], micro: int, *,
                 stages: int, microbatches: int, schedule: str, optimizer: str, precision: str, device_type: str,
                 budget: bool) -> StageMemory | None:
    """The stages by the one memory model (comm/pipeline/memory.py) at `micro` samples per micro-batch: the model
    walked on the meta device, with the heap glibc keeps as the allocator policy a run takes on `device_type` (with
    a `budget`: lean) keeps it. None when the model cannot run on the meta device, or its blocks there are not
    `blocked`'s: the blocks' bytes stand in (split/partition.py)."""
    from scaletrain.comm.pipeline.memory import stages_of
    from scaletrain.distributed.allocator import resolved, retained_below
    from scaletrain.perf.footprint import model_memory

    policy = resolved("auto", budget, device_type)
    mm = model_memory(factory, micro, tuple(input_shape), optimizer, precision,
                      retained_below=retained_below(policy) if policy else None)
    if mm is None or [b.name for b in mm.blocks] != blocked.names:
        return None
    return stages_of(mm, list(mm.blocks), stages=stages, microbatches=microbatches, schedule=schedule)


def costs_for(blocked: Blocked, model: nn.Module, input_shape: tuple[int, ...], micro: int, *,
              source: str = "auto", calibration: dict[str, Any] | None = None,
              precision: str = "fp32", threads: int | None = None, ranks: int | None = None,
              progress: Callable[[str, int, int], None] | None = None, predictor: Any = None
              ) -> tuple[list[BlockCost], str]:
    """(block costs, their source): auto = predicted with a calibration (or a point's `predictor`: either basis),
    measured without one. `threads` and `ranks`: the calibrated thread count predicted times are priced at and the
    processes sharing the node; `progress`: told as blocks are measured (split/costs.py's block_costs)."""
    if source == "auto":
        source = "predicted" if calibration is not None or predictor is not None else "measured"
    return block_costs(blocked, model, input_shape, micro, source=source, calibration=calibration,
                       precision=precision, threads=threads, ranks=ranks, progress=progress,
                       predictor=predictor), source


def choose(method: str, blocked: Blocked, model: nn.Module, input_shape: tuple[int, ...], *, stages: int,
           microbatches: int, schedule: str, batch_size: int, link_bytes_per_s: float = DEFAULT_LINK,
           latency_s: float = 0.0, memory_limit: int | None = None, calibration: dict[str, Any] | None = None,
           precision: str = "fp32", optimizer: str = "sgd", model_name: str | None = None,
           costs: list[BlockCost] | None = None, memory: StageMemory | None = None) -> Partition:
    """The split `method` names, priced. auto: the optimal split (Infeasible when nothing fits memory_limit);
    uniform, params, time: the baselines; anything else: a split.json's path (load_split). Block costs are
    predicted with a calibration, else measured here (a few seconds), unless `costs` are given. `memory`: the stages
    by the memory model (comm/pipeline/memory.py) that `memory_limit` holds them to; None: the blocks' bytes."""
    micro = micro_batch(batch_size, microbatches)
    pipe = pipeline_args(microbatches=microbatches, schedule=schedule, optimizer=optimizer,
                         link_bytes_per_s=link_bytes_per_s, latency_s=latency_s, memory_limit=memory_limit,
                         memory=memory)
    bounds = load_split(method, blocked, stages, model_name) if method not in METHODS else None
    check_memory(block_sizes(blocked, micro, precision), stages, **pipe)  # stages and memory, before any timing
    source = "given"
    if costs is None:
        costs, source = costs_for(blocked, model, input_shape, micro, calibration=calibration, precision=precision)
    if method == "auto":
        chosen = optimal(costs, stages, **pipe)
    elif bounds is not None:
        chosen = evaluate(costs, bounds, method=f"file {method}", **pipe)
    else:
        chosen = evaluate(costs, BASELINES[method](costs, stages), method=method, **pipe)
    chosen.notes.append(f"block costs {source}")
    return chosen


def load_split(path: str | Path, blocked: Blocked, stages: int, model_name: str | None = None) -> Bounds:
    """The chosen bounds of a split.json (or a directory holding one) made for this model and stage count."""
    path = Path(path)
    if path.is_dir():
        path = path / SPLIT
    make = f"make one with `scaletrain split --model {model_name or 'MODEL'} --stages {stages}`"
    if not path.is_file():
        raise UserError(f"split file {path} does not exist: {make}, or use --split auto|uniform|params|time")
    try:
        data = json.loads(path.read_text())
        model, names, bounds = data["model"], data["blocks"], [tuple(b) for b in data["chosen"]["bounds"]]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a split.json written by scaletrain split ({type(e).__name__}): {make}") \
            from None
    if model_name is not None and model != model_name:
        raise UserError(f"{path} was made for model {model}, not {model_name}: {make}")
    if names != blocked.names:
        raise UserError(f"{path} was made for {model} with {len(names)} blocks that are not this model's "
                        f"{len(blocked.names)} ({_first_difference(names, blocked.names)}): {make}")
    if len(bounds) != stages:
        raise UserError(f"{path} splits {model} into {len(bounds)} stages, not {stages}: pass --stages "
                        f"{len(bounds)} or {make}")
    try:
        check_bounds(bounds, len(names))
    except ValueError as e:
        raise UserError(f"{path}: {e}: {make}") from None
    return bounds


def _first_difference(a: list[str], b: list[str]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"block {i} is {x} there, {y} here"
    return f"{len(a)} against {len(b)} blocks"


def split_report(model_name: str, blocked: Blocked, input_shape: tuple[int, ...], batch_size: int,
                 chosen: Partition, others: dict[str, Partition], *, link_bytes_per_s: float,
                 memory_limit: int | None, costs_source: str, costs: list[BlockCost],
                 notes: list[str] | None = None) -> dict[str, Any]:
    """split.json: the setting, the blocks, the chosen split and the baselines, each with its predicted step
    time and samples per second (format in docs/split.md)."""
    uniform = others.get("uniform")

    def priced(p: Partition) -> dict[str, Any]:
        d = p.to_dict()
        d["samples_per_s"] = batch_size / p.step_s if p.step_s > 0 else None
        d["speedup_over_uniform"] = uniform.step_s / p.step_s if uniform and p.step_s > 0 else None
        return d

    return {"kind": "scaletrain-split", "model": model_name, "input_shape": list(input_shape),
            "batch_size": batch_size, "microbatches": chosen.microbatches,
            "micro_batch": batch_size // chosen.microbatches, "schedule": chosen.schedule,
            "stages": len(chosen.bounds), "link_bytes_per_s": link_bytes_per_s, "memory_per_stage": memory_limit,
            "costs_source": costs_source, "blocks": blocked.names,
            "block_costs": [asdict(c) for c in costs], "chosen": priced(chosen),
            "baselines": {name: priced(p) for name, p in others.items()}, "notes": list(notes or [])}

