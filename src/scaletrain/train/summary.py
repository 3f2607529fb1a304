"""summary.json of a training run: assembled and written here alone (docs/run-directory.md, docs/metrics.md).

A finished or stopped run's summary: the run's facts (below), the strategy's entries, and the
profiler's analysis (phases, stragglers, diagnosis). A run that failed before finishing gets the short
form of `failed`, written by the launcher through the same writer.
"""

from __future__ import annotations

import time
from typing import Any

import torch

import scaletrain
from scaletrain.analysis.throughput import steady_samples_per_s
from scaletrain.config import TrainConfig
from scaletrain.comm.spec import compressible
from scaletrain.distributed.device import machine_cores, testbed_cores
from scaletrain.distributed.rank import RankInfo
from scaletrain.distributed.allocator import settle
from scaletrain.rundir import RunDir, read_jsonl, write_json_atomic
from scaletrain.train.optim import peak_lr
from scaletrain.train.restarts import path_of, restarts


def placement(device: torch.device, rank: RankInfo) -> dict[str, Any]:
    """How this run sat on its machine: what tells a starved or oversubscribed CPU run (docs/metrics.md)."""
    cpu = device.type == "cpu"
    return {"device": device.type, "local_world_size": rank.local_world_size,
            "threads_per_rank": torch.get_num_threads() if cpu else None,
            "cpu_cores": machine_cores() if cpu else None, "testbed": testbed_cores() is not None, **settle()}


def exchange(strategy, model: torch.nn.Module) -> dict[str, Any]:
    """What the diagnosis's levers rest on (docs/metrics.md): the bytes of one rank's gradients, whether DDP's
    buckets carry them (--bucket-cap-mb applies), whether --compress goes with the strategy, the other settings
    that change its exchange, and whether its ranks step together (a slow one holds the others back)."""
    return {"gradient_bytes": sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad),
            "gradient_buckets": strategy.gradient_buckets, "compressible": compressible(strategy.cfg.strategy.name),
            "exchange_settings": list(strategy.exchange_settings), "lockstep": strategy.lockstep}


def run_summary(trainer, status: str, wall_time: float, digests: list[str], where: dict[str, Any],
                settled: int | None = None) -> dict[str, Any]:
    """The run's own facts, from the trainer at the end of fit (rank 0); `settled`: the step from which every
    rank's heap had settled (the analysis's), where the steady steps start at the latest."""
    cfg, world, h, device = trainer.cfg, trainer.rank.world_size, trainer.history, trainer.device
    records = read_jsonl(trainer.run_dir.metrics(0))
    return {
        "status": status, "model": cfg.model.name, "dataset": cfg.data.dataset, "world_size": world,
        "global_batch": cfg.optim.batch_size * trainer.replicas, "epochs": len(h.epoch_times_s),
        "epochs_planned": cfg.optim.epochs,
        "top1": h.top1, "top5": h.top5, "best_top1": h.best_top1, "epoch_times_s": h.epoch_times_s,
        "samples_per_s": steady_samples_per_s(records, trainer.replicas, trainer.steps_per_epoch, settled),
        "effective_lr": peak_lr(cfg.optim, trainer.replicas), "precision": cfg.model.precision,
        "device": device.type if device.type == "cpu" else torch.cuda.get_device_name(device),
        "backend": trainer.backend, "steps": trainer.global_step, "train_samples": len(trainer.data.train),
        "val_samples": len(trainer.data.val), "bad_images_skipped": h.bad_images_skipped,
        "bad_images": sorted(trainer.bad_paths)[:20],
        "restarts": restarts(read_jsonl(path_of(trainer.run_dir), notes=[])),
        "checkpoints": {"written": len(trainer.checkpoint_s), "total_s": round(sum(trainer.checkpoint_s), 4),
                        "max_s": round(max(trainer.checkpoint_s, default=0.0), 4)},
        "param_digests": digests, "replicas_identical": len(set(digests)) == 1,
        "checkpointed_blocks": trainer.checkpointed,
        **{k: v for k, v in where.items() if k != "device"},
        "wall_time_s": wall_time, "scaletrain_version": scaletrain.__version__,
        "torch_version": torch.__version__, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def failed(run: RunDir, cfg: TrainConfig, message: str) -> None:
    """The summary of a run that ended before finishing: why, and whether it can resume."""
    epochs = read_jsonl(run.epochs, notes=[])  # a worker killed mid-write may leave half a last line
    write(run, {"status": "failed", "error": message, "model": cfg.model.name, "dataset": cfg.data.dataset,
                "world_size": cfg.layout.world, "epochs": len(epochs), "epochs_planned": cfg.optim.epochs,
                "resumable": run.checkpoint.exists(), "restarts": restarts(read_jsonl(path_of(run), notes=[]))})


def write(run: RunDir, summary: dict[str, Any]) -> None:
    write_json_atomic(run.summary, summary)
