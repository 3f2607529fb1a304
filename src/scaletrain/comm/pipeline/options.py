"""The pipeline's settings (`--stages`, `--microbatches`, `--pipeline-schedule`, `--split`), their checks and
the layout they make: no torch (config/ sections; comm/registry.py OPTION_SECTIONS)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from scaletrain.config.fields import at_least, check_choice, key
from scaletrain.config.layout import Layout
from scaletrain.errors import UserError

SCHEDULES = ("gpipe", "1f1b")


def stages_x_replicas(text: str) -> tuple[int, int] | None:
    """`--nproc KxR` (R replicas of a K-stage pipeline, K x R processes) -> (K, R); None for anything else."""
    k, sep, r = text.lower().replace(" ", "").partition("x")
    return (int(k), int(r)) if sep and k.isdigit() and r.isdigit() else None


def expand_nproc(overrides: dict[str, Any]) -> dict[str, Any]:
    """The flags given with `--nproc KxR` spelt as `--nproc K*R --stages K` (one line when --stages says
    otherwise); the others unchanged."""
    nproc = overrides.get("nproc")
    kxr = stages_x_replicas(nproc) if isinstance(nproc, str) else None
    if kxr is None:
        return overrides
    k, r = kxr
    if overrides.get("stages", k) != k:
        raise UserError(f"--nproc {k}x{r} means {k} stages, but --stages is {overrides['stages']}: give one of them")
    return {**overrides, "nproc": k * r, "stages": k}


@dataclass(kw_only=True)
class PipelineOptions:
    """The pipeline (`--strategy pipeline`; docs/split.md)."""

    stages: int | None = None
    """pipeline: pipeline stages, one process each (default: all the job's processes, nproc x nnodes); with
    --strategy spatial, stages of S tiles each (default 1: no pipeline; docs/spatial.md)."""

    microbatches: int = 4
    """pipeline: micro-batches each step's batch is split into (must divide --batch-size)."""

    schedule: str = field(default="1f1b", metadata=key("pipeline_schedule"))
    """pipeline: `gpipe` (all forwards, then all backwards) or `1f1b` (one forward, one backward: fewer
    activations in flight); both from torch.distributed.pipelining (docs/split.md)."""

    split: str = "auto"
    """pipeline: where the model is cut into stages: `auto` (the predicted-fastest split under the memory
    the stages have, as `scaletrain split` chooses it), `uniform` (equal block counts), `params` (equal
    parameter counts, DeepSpeed's default), `time` (torchgpipe's balance by measured time) or a split.json
    written by `scaletrain split`."""

    def __post_init__(self) -> None:
        check_choice("pipeline_schedule", self.schedule, SCHEDULES)
        at_least(self, 1, "microbatches")
        if self.stages is not None and self.stages < 2:
            raise UserError(f"--stages must be at least 2 (got {self.stages}): one stage is --strategy allreduce")

    def check(self, cfg: Any) -> None:  # a TrainConfig (config/ imports this module)
        """What the pipeline refuses of the rest of the configuration."""
        if cfg.model.precision == "fp16":
            raise UserError("--precision fp16 is not supported with --strategy pipeline (the schedule runs "
                            "backward itself, without the loss scaler): use --precision bf16 or fp32")
        if cfg.model.sync_bn:
            raise UserError("--sync-bn is not supported with --strategy pipeline: drop --sync-bn")
        if cfg.optim.batch_size % self.microbatches:
            raise UserError(f"--microbatches {self.microbatches} does not divide --batch-size "
                            f"{cfg.optim.batch_size}: choose a batch size that is a multiple of it")

    def shape(self, layout: Layout, cfg: Any = None) -> Layout:
        """K stages (default: every rank one) x R = world / K replicas."""
        return dataclasses.replace(layout, stages=self.stages or layout.world)

    def check_layout(self, cfg: Any, layout: Layout) -> None:
        if layout.world < 2:
            raise UserError(f"--strategy pipeline needs at least 2 processes, one per stage (got --nproc x --nnodes "
                            f"= {layout.world}): give --nproc 2 or more, or --nproc KxR (K stages x R replicas)")
        if layout.world % layout.stages:
            raise UserError(f"--strategy pipeline with --stages {layout.stages} needs a multiple of {layout.stages} "
                            f"processes (got --nproc x --nnodes = {layout.world}): one process per stage and replica")
        if self.microbatches < layout.stages:  # torch.distributed.pipelining's schedules refuse fewer
            raise UserError(f"--microbatches {self.microbatches} is fewer than the {layout.stages} stages: a pipeline "
                            f"needs at least one micro-batch per stage; give --microbatches {layout.stages} or more "
                            f"(and a --batch-size they divide)")
