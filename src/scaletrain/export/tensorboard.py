"""TensorBoard scalars per rank (tensorboard/rank{r}/): a sink of the training loop (train/loop.py), fed its
resolved step records and rank 0's epoch records.

Writing a step's dozen scalars costs the rank 0.7-0.9 ms of CPU (event protos, the writer's thread): 9% of the
MLP's 12-ms step on two CPU ranks (benchmarks/tensorboard_cost.py), priced by no prediction. So a point is written
once per `every` steps (`--tensorboard-every`, 10 by default), each scalar the window's mean; the step records
themselves stay, every one, in metrics-rank{r}.jsonl (docs/metrics.md)."""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path
from typing import Any

from scaletrain.errors import UserError


def available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def wanted(setting: str) -> bool:
    """`auto`: when tensorboard is installed; `on`: required (a clear error when missing); `off`."""
    if setting == "on" and not available():
        raise UserError("--tensorboard on: the tensorboard package is not installed: "
                        "pip install tensorboard, or pass --tensorboard off")
    return setting == "on" or (setting == "auto" and available())


def window_scalars(records: list[dict[str, Any]]) -> dict[str, float]:
    """The scalars of one TensorBoard point from the step records of its window: the mean of each measured value
    over the steps that have it (a value no step measured is left out, never written as 0); the learning rate the
    last step's; the throughput the samples over the time (each step's rate times its time, summed, over the
    steps' time), not a mean of rates."""
    out: dict[str, float] = {}

    def mean(tag: str, values: list[Any]) -> None:
        values = [v for v in values if v is not None]
        if values:
            out[tag] = statistics.fmean(values)

    mean("train/loss", [r.get("loss") for r in records])
    lrs = [r["lr"] for r in records if r.get("lr") is not None]
    if lrs:
        out["train/lr"] = lrs[-1]
    mean("step/time_s", [r.get("step_time_s") for r in records])
    rated = [r for r in records if r.get("samples_per_s") and r.get("step_time_s")]
    if rated:
        out["step/samples_per_s"] = (sum(r["samples_per_s"] * r["step_time_s"] for r in rated)
                                     / sum(r["step_time_s"] for r in rated))
    phases = dict.fromkeys(p for r in records for p in (r.get("phases_s") or {}))
    for phase in phases:
        mean(f"phases_s/{phase}", [(r.get("phases_s") or {}).get(phase) for r in records])
    mean("comm/overlap_ratio", [r.get("overlap_ratio") for r in records])
    mean("comm/bytes_sent", [r.get("bytes_sent") for r in records])
    return out


class ScalarSink:
    """Writes, once per `every` steps and at each epoch's last step, the window's loss, learning rate, step time,
    throughput and phases (window_scalars) at the window's last step; and each epoch's results. Also a plain
    step sink of StepProfiler (called with each record)."""

    def __init__(self, run_dir: Path, rank: int, every: int = 1) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard" / f"rank{rank}"))
        self.every = max(1, every)
        self.window: list[dict[str, Any]] = []

    def epoch_start(self, epoch: int, epochs: int, steps: int, done: int = 0) -> None:
        pass

    def step(self, record: dict[str, Any]) -> None:
        self.window.append(record)
        steps = record.get("epoch_steps")
        if len(self.window) >= self.every or (steps is not None and record.get("step_in_epoch") == steps - 1):
            self._flush()

    __call__ = step

    def _flush(self) -> None:
        if not self.window:
            return
        step = self.window[-1]["step"]
        for tag, value in window_scalars(self.window).items():
            self.writer.add_scalar(tag, value, step)
        self.window = []

    def epoch_end(self, record: dict[str, Any]) -> None:
        self._flush()
        for key in ("epoch_time_s", "train_loss", "lr", "top1", "top5", "val_loss"):
            if record.get(key) is not None:
                self.writer.add_scalar(f"epoch/{key}", record[key], record["epoch"])

    def close(self) -> None:
        self._flush()
        self.writer.close()
