"""TensorBoard scalars per rank (tensorboard/rank{r}/): a sink of the training loop (train/loop.py), fed its
resolved step records and rank 0's epoch records."""

from __future__ import annotations

import importlib.util
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


class ScalarSink:
    """Writes each step record's loss, learning rate, step time, throughput and phases, and each epoch's
    results. Also a plain step sink of StepProfiler (called with each record)."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard" / f"rank{rank}"))

    def epoch_start(self, epoch: int, epochs: int, steps: int, done: int = 0) -> None:
        pass

    def step(self, record: dict[str, Any]) -> None:
        step, add = record["step"], self.writer.add_scalar
        if record.get("loss") is not None:
            add("train/loss", record["loss"], step)
        if record.get("lr") is not None:
            add("train/lr", record["lr"], step)
        add("step/time_s", record["step_time_s"], step)
        if record.get("samples_per_s"):
            add("step/samples_per_s", record["samples_per_s"], step)
        for phase, seconds in (record.get("phases_s") or {}).items():
            add(f"phases_s/{phase}", seconds, step)
        if record.get("overlap_ratio") is not None:
            add("comm/overlap_ratio", record["overlap_ratio"], step)
        if "bytes_sent" in record:
            add("comm/bytes_sent", record["bytes_sent"], step)

    __call__ = step

    def epoch_end(self, record: dict[str, Any]) -> None:
        for key in ("epoch_time_s", "train_loss", "lr", "top1", "top5", "val_loss"):
            if record.get(key) is not None:
                self.writer.add_scalar(f"epoch/{key}", record[key], record["epoch"])

    def close(self) -> None:
        self.writer.close()
