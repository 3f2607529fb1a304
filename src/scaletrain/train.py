"""The training worker: one process per device (or CPU rank), reading like the algorithm it runs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import signal
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

import scaletrain
from scaletrain import checkpoint, failure
from scaletrain.comm import setup as comm_setup
from scaletrain.config import TrainConfig, config_from_dict, parse_inject, torch_profile_window
from scaletrain.data import DelayedDataset, build_datasets, collate
from scaletrain.dist import (RankInfo, barrier, choose_device, cpu_threads_per_rank, gather_objects,
                             init_process_group, machine_cores, shutdown)
from scaletrain.errors import UserError
from scaletrain.evaluate import ShardSampler, evaluate
from scaletrain.export import tensorboard
from scaletrain.export.tensorboard import ScalarSink
from scaletrain.metrics import steady_samples_per_s
from scaletrain.models import build_model
from scaletrain.optim import build_optimizer, build_scheduler, peak_lr, resume_optimizer
from scaletrain.profiler import StepProfiler
from scaletrain.progress import EpochBar, SilentBar
from scaletrain.rundir import RunDir, keep_epochs_before, read_jsonl
from scaletrain.summary_view import epoch_line

AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def worker_main(cfg_dict: dict[str, Any], error_dir: str) -> None:
    """Entry point the elastic agent starts in each worker; a UserError becomes one line for the parent."""
    rank = RankInfo.from_env()
    cfg = config_from_dict(cfg_dict)
    heartbeat = failure.Heartbeat(error_dir, rank.rank)  # the launcher tells a stopped rank by its silence
    try:
        run(cfg, rank)
    except UserError as e:
        failure.record_error(error_dir, None, rank.rank, e, user_error=True)
        sys.exit(2)
    except Exception as e:  # a bug, a user model's error, a peer gone: keep the cause and the traceback
        failure.record_error(error_dir, cfg.out, rank.rank, e, user_error=False)
        sys.exit(1)
    heartbeat.stop()  # (a failed rank beats on until it has exited: the watchdog leaves it alone)


def run(cfg: TrainConfig, rank: RankInfo) -> dict[str, Any] | None:
    """Set up device and process group, train, tear down. Returns the summary on rank 0."""
    if cfg.strategy.startswith("ps-"):
        return _run_ps(cfg, rank)
    device = choose_device(cfg.device, rank)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads_per_rank(rank.local_world_size, cfg.threads))
    backend = init_process_group(device, rank, timeout_s=cfg.timeout)
    try:
        return Trainer(cfg, rank, device, backend).fit()
    finally:
        shutdown()


def _run_ps(cfg: TrainConfig, rank: RankInfo) -> dict[str, Any] | None:
    """A parameter-server job: the last --ps-servers ranks serve shards, the others train (ps/)."""
    from scaletrain.ps import links as ps_links
    from scaletrain.ps.resume import saved_state
    from scaletrain.ps.server import serve

    # a resume that cannot continue (another layout) is refused on every rank alike, before any rank waits
    saved = saved_state(cfg, rank.world_size) if cfg.resume else None
    is_server = ps_links.Layout(rank.world_size, cfg.ps_servers).is_server(rank.rank)
    device = torch.device("cpu") if is_server else choose_device(cfg.device, rank)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads_per_rank(rank.local_world_size, cfg.threads))
    backend = "nccl" if device.type == "cuda" else "gloo"
    links = ps_links.join(rank, cfg.ps_servers, worker_group=cfg.strategy == "ps-sync", backend=backend,
                          device=device)
    try:
        if links.is_server:
            serve(cfg, links, build_data_and_model(cfg)[1], saved["servers"][links.index] if saved else None)
            return None
        return Trainer(cfg, links.rank, device, backend, ps=links).fit()
    finally:
        shutdown()


def build_data_and_model(cfg: TrainConfig):
    """Datasets and the model, after seeding: the same initial weights in every process that calls it."""
    _seed_everything(cfg.seed)
    data = build_datasets(cfg.dataset, image_size=cfg.image_size, seed=cfg.seed,
                          synthetic_samples=cfg.synthetic_samples,
                          synthetic_classes=cfg.synthetic_classes, augment=cfg.augment)
    model = build_model(cfg.model, num_classes=data.num_classes, in_channels=data.in_channels,
                        image_size=data.image_size, stem=cfg.stem, width=cfg.width)
    return data, model


@dataclass
class History:
    """Per-epoch results that must survive a resume (they live in the checkpoint)."""

    epoch_times_s: list[float] = field(default_factory=list)
    top1: float | None = None
    top5: float | None = None
    best_top1: float | None = None
    bad_images_skipped: int = 0


class Trainer:
    def __init__(self, cfg: TrainConfig, rank: RankInfo, device: torch.device, backend: str,
                 ps=None) -> None:
        self.cfg, self.rank, self.device, self.backend = cfg, rank, device, backend
        self.run_dir = RunDir(Path(cfg.out))
        self.autocast = AUTOCAST[cfg.precision]
        # ps-async workers share no process group: no collective may wait for a worker that died
        self.independent = cfg.strategy == "ps-async"
        self.data, model = build_data_and_model(cfg)  # same seed on every rank: identical initial weights
        if cfg.sync_bn:
            if device.type != "cuda":
                raise UserError("--sync-bn needs CUDA (PyTorch's SyncBatchNorm has no CPU kernel): drop --sync-bn")
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        self.model = model.to(device)
        world = rank.world_size
        use_ddp = world > 1 and ps is None  # with a parameter server, the servers aggregate instead
        self.ddp = DDP(self.model, device_ids=[device.index] if device.type == "cuda" else None,
                       bucket_cap_mb=cfg.bucket_cap_mb) if use_ddp else self.model
        # --strategy / --compress: the hook DDP runs per gradient bucket (collective: may create a group)
        self.comm = comm_setup.build(cfg.strategy, cfg.compress, world if use_ddp else 1,
                                     seed=cfg.seed + 7919 * rank.rank, model=self.model)
        if self.comm.hook is not None and cfg.profile == "off":
            self.ddp.register_comm_hook(self.comm.state, self.comm.hook)  # with profiling, the profiler wraps it
        inject = parse_inject(cfg.inject)
        self.slow_s = inject.slow_rank_s if inject.slow_rank == rank.rank else 0.0
        self.kill_step = inject.kill_step if inject.kill_rank == rank.rank else None
        self.stop_step = inject.stop_step if inject.stop_rank == rank.rank else None
        if inject.data_s:
            self.data = dataclasses.replace(self.data, train=DelayedDataset(self.data.train, inject.data_s))

        self.sampler = DistributedSampler(self.data.train, num_replicas=world, rank=rank.rank,
                                          shuffle=True, seed=cfg.seed)
        self.loader_rng = torch.Generator()
        # drop_last: every step has the full global batch, as the linear scaling rule assumes
        self.train_loader = DataLoader(self.data.train, batch_size=cfg.batch_size, sampler=self.sampler,
                                       num_workers=cfg.workers, collate_fn=collate, drop_last=True,
                                       pin_memory=device.type == "cuda", generator=self.loader_rng,
                                       persistent_workers=cfg.persistent_workers and cfg.workers > 0)
        # independent workers: worker 0 alone evaluates, on the whole validation split
        val_shard = (0, 1) if self.independent else (rank.rank, world)
        self.val_loader = DataLoader(self.data.val, batch_size=max(cfg.batch_size, 256),
                                     sampler=ShardSampler(len(self.data.val), *val_shard),
                                     num_workers=cfg.workers, collate_fn=collate,
                                     pin_memory=device.type == "cuda",
                                     persistent_workers=cfg.persistent_workers and cfg.workers > 0)
        self.steps_per_epoch = len(self.train_loader)
        if self.steps_per_epoch == 0:
            raise UserError(f"--batch-size {cfg.batch_size} x {world} ranks is more than the "
                            f"{len(self.data.train)} training samples: lower --batch-size")

        # with a parameter server the servers step their own optimizer; this one only tracks the schedule
        self.optimizer = build_optimizer(cfg, self.model, world)
        self.scheduler = build_scheduler(cfg, self.optimizer, self.steps_per_epoch, world)
        self.ps = _ps_client(cfg, ps, self.model, self.steps_per_epoch) if ps is not None else None
        self.scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
        self.criterion = torch.nn.CrossEntropyLoss()
        self.history = History()
        self.start_epoch = 0
        self.global_step = 0
        self.bad_paths: set[str] = set()
        if cfg.resume:
            self._restore()
        else:
            torch.manual_seed(cfg.seed + 1 + rank.rank)  # per-rank augmentation streams
        self.tensorboard = ScalarSink(self.run_dir.root, rank.rank) if tensorboard.wanted(cfg.tensorboard) else None
        # collective (aligns the ranks' clocks): every rank builds it here
        self.prof = StepProfiler(cfg.out, self.ddp if use_ddp else None, enabled=cfg.profile == "on",
                                 rank=rank.rank, world_size=world,
                                 device=device, first_step=self.global_step, inject_comm_s=inject.comm_s,
                                 comm_hook=self.comm.hook, comm_state=self.comm.state,
                                 torch_profile=torch_profile_window(cfg.torch_profile) if cfg.torch_profile else None,
                                 sinks=[self.tensorboard] if self.tensorboard else [])

    # ---------------------------------------------------------------- training
    def fit(self) -> dict[str, Any] | None:
        cfg, main = self.cfg, self.rank.is_main
        bar = EpochBar() if main and cfg.progress else SilentBar()
        t_run = time.perf_counter()
        last = cfg.epochs if cfg.stop_after is None else min(cfg.epochs, self.start_epoch + cfg.stop_after)
        try:
            for epoch in range(self.start_epoch, last):
                epoch_time = self.train_epoch(epoch, bar)
                result = None
                if ((epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs) and (main or not self.independent):
                    if self.independent:
                        self.ps.fetch()  # evaluate (and save) the servers' parameters as they are now
                    _sync_buffers(self.model)  # evaluate (and save) rank 0's BN statistics on every rank
                    result = evaluate(self.model, self.val_loader, self.device, self.autocast,
                                      self.data.num_classes)
                self._end_epoch(epoch, epoch_time, result)
        finally:
            bar.close()
            self.prof.close()
            if self.tensorboard is not None:
                self.tensorboard.close()
        status = "completed" if last == cfg.epochs else "stopped"
        ps_end = self.ps.close(chief=main) if self.ps is not None else None  # worker 0: once all finished
        digests = gather_objects(param_digest(self.model))
        self.bad_paths = set().union(*gather_objects(self.bad_paths))
        base = self._summary(status, time.perf_counter() - t_run, digests) if main else None
        if main and ps_end is not None:
            base |= self._ps_summary(*ps_end)
        # collective: rank 0 adds phases, stragglers and diagnosis from every rank's file, writes summary.json
        summary = self.prof.finish(base, config={**cfg.to_dict(), **self._placement()})
        barrier()  # all ranks leave together: a rank tearing down gloo while a peer still uses it can abort
        return summary

    def train_epoch(self, epoch: int, bar) -> float:
        """One pass over this rank's shard; returns the epoch's training wall time."""
        cfg, prof = self.cfg, self.prof
        self.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        # loader workers draw their seeds from this generator: fixed per (seed, epoch, rank) for resumes
        self.loader_rng.manual_seed(cfg.seed * 1_000_003 + epoch * 1009 + self.rank.rank)
        self.ddp.train()
        bar.start_epoch(epoch, cfg.epochs, self.steps_per_epoch)
        t_start = time.perf_counter()
        self.loss_sum = 0.0
        for i, (x, y, bad) in enumerate(prof.data(self.train_loader)):  # time blocked here: data_wait
            if bad:
                self._bad_images(bad)
            with prof.phase("h2d"):
                x = x.to(self.device, non_blocking=True)
                y = y.to(self.device, non_blocking=True)
            with prof.phase("forward"):
                if self.slow_s:
                    time.sleep(self.slow_s)  # --inject slow-rank: this rank computes slower than its peers
                with torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None):
                    loss = self.criterion(self.ddp(x), y)
            with prof.phase("optimizer"):
                # freed just before backward allocates new gradients, so the allocator hands the same memory
                # back; freed right after the step instead, steps were 20% slower on CPU (page faults)
                self.optimizer.zero_grad(set_to_none=True)
            with prof.phase("backward"):  # DDP all-reduces gradient buckets while backward runs
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            extra: dict[str, Any] = {}
            if self.ps is not None:  # push gradients, pull parameters: the servers apply the update
                with prof.comm(self.ps.push_bytes) as sent:
                    extra = self.ps.step(epoch * self.steps_per_epoch + i)
                    sent.wire = self.ps.sent  # what the push really sent (compressed; 0 if ps-async did not push)
                    sent.raw_wire = self.ps.push_bytes if self.ps.sent else 0
            else:
                with prof.phase("optimizer"):
                    if self.scaler is not None:
                        self.scaler.step(self.optimizer)
                        self.scaler.update()
                    else:
                        self.optimizer.step()
            lr = self.optimizer.param_groups[0]["lr"]
            with warnings.catch_warnings():  # with a parameter server the local optimizer is never stepped
                warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
                self.scheduler.step()
            if self.kill_step is not None and epoch * self.steps_per_epoch + i + 1 >= self.kill_step:
                os.kill(os.getpid(), signal.SIGKILL)  # --inject kill-rank: this worker dies, as a crash would
            if self.stop_step is not None and epoch * self.steps_per_epoch + i + 1 == self.stop_step:
                os.kill(os.getpid(), signal.SIGSTOP)  # --inject stop-rank: this worker hangs, its peers wait
            # records come back resolved: at once on CPU, one step late on CUDA (no GPU sync per step)
            for record in prof.step_end(loss=loss.detach(), samples=len(y), epoch=epoch, step_in_epoch=i, lr=lr,
                                        **extra):
                self._after_step(record, bar)
        for record in prof.flush():  # on CUDA: the last step's record (waits for the GPU, once per epoch)
            self._after_step(record, bar)
        bar.end_epoch()
        self.epoch_loss = self.loss_sum / self.steps_per_epoch
        return time.perf_counter() - t_start

    def _after_step(self, record: dict[str, Any], bar) -> None:
        loss, step_time = record["loss"], record["step_time_s"]
        if not math.isfinite(loss) and self.scaler is None:
            raise UserError(f"training diverged: loss is {loss} at epoch {record['epoch'] + 1} step "
                            f"{record['step_in_epoch'] + 1} (lr {record['lr']:.4g}): lower --lr or add --warmup-epochs")
        bar.step(loss, record["samples"] * self.rank.world_size / step_time if step_time > 0 else None)
        self.global_step = record["step"] + 1
        self.loss_sum += loss

    def _bad_images(self, bad: list[str]) -> None:
        if self.cfg.bad_images == "error":
            raise UserError(f"unreadable image {bad[0]}: replace or delete it, or pass --bad-images skip")
        self.history.bad_images_skipped += len(bad)
        self.bad_paths.update(b.split(": ")[0] for b in bad)

    # ------------------------------------------------------- epoch bookkeeping
    def _end_epoch(self, epoch: int, epoch_time: float, result) -> None:
        h = self.history
        h.epoch_times_s.append(epoch_time)
        if result is not None:
            h.top1, h.top5 = result.top1, result.top5
            h.best_top1 = max(h.best_top1 or 0.0, result.top1)
        rngs = gather_objects(checkpoint.rng_state())  # every rank's RNG, so a resume replays all of them
        comm_states = gather_objects(self.comm.state_dict())  # compressor residuals differ per rank
        # the servers' shards and optimizer state (ps-sync: every worker takes part, see ps/client.py)
        ps_state = self.ps.checkpoint(chief=self.rank.is_main) if self.ps is not None else None
        skipped = gather_objects(h.bad_images_skipped)
        if self.rank.is_main:
            self._save_checkpoint(epoch + 1, rngs, comm_states, ps_state)
            record = {"epoch": epoch, "epoch_time_s": epoch_time, "train_loss": self.epoch_loss,
                      "lr": self.optimizer.param_groups[0]["lr"], "bad_images_skipped": sum(skipped)}
            if result is not None:
                record |= {"top1": result.top1, "top5": result.top5, "val_loss": result.loss}
            with open(self.run_dir.epochs, "a") as f:
                f.write(_json_line(record))
            if self.tensorboard is not None:
                self.tensorboard.epoch(record)
            print(epoch_line(record, self.cfg.epochs), flush=True)
        barrier()  # nobody races ahead while rank 0 writes the checkpoint

    def _save_checkpoint(self, epochs_done: int, rngs: list, comm_states: list, ps_state: dict | None) -> None:
        checkpoint.save_atomic({
            "format": checkpoint.FORMAT, "epoch": epochs_done, "global_step": self.global_step,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": rngs, "comm": comm_states, "world_size": self.rank.world_size, "config": self.cfg.to_dict(),
            "history": vars(self.history).copy(), "ps": ps_state,
        }, self.run_dir.checkpoint)

    def _restore(self) -> None:
        ckpt = checkpoint.load(self.run_dir.checkpoint)
        checkpoint.check_compatible(ckpt, self.cfg.model, self.cfg.dataset, self.run_dir.checkpoint)
        try:
            self.model.load_state_dict(ckpt["model"])
        except RuntimeError:
            raise UserError(f"checkpoint {self.run_dir.checkpoint} does not fit this model (its shapes differ: "
                            "another --width/--image-size/--stem?): resume with the original settings") from None
        # the optimizer's state continues; its settings and the LR schedule are this invocation's
        # (a resume with --epochs 3 re-plans the schedule for 3 epochs, from the current step)
        self.start_epoch, self.global_step = ckpt["epoch"], ckpt["global_step"]
        # the schedule's position counts epochs done, in this invocation's steps per epoch (the same as
        # global_step unless the number of processes changed)
        resume_optimizer(self.optimizer, self.scheduler, ckpt["optimizer"], self.start_epoch * self.steps_per_epoch)
        if self.scaler is not None and ckpt["scaler"] is not None:
            self.scaler.load_state_dict(ckpt["scaler"])
        self.history = History(**ckpt["history"])
        # (ps-async workers share no group: the checkpoint holds worker 0's RNG alone)
        if ckpt["world_size"] == self.rank.world_size and self.rank.rank < len(ckpt["rng"]):
            checkpoint.set_rng_state(ckpt["rng"][self.rank.rank])
            if ckpt.get("comm"):
                self.comm.load_state_dict(ckpt["comm"][self.rank.rank], self.device)
        else:  # a different world size cannot replay the same data order anyway
            torch.manual_seed(self.cfg.seed + 1 + self.rank.rank + 7919 * self.start_epoch)
        if self.ps is not None:  # the servers loaded their part of ckpt["ps"] before sending parameters
            self.ps.resume(ckpt["ps"], self.rank.rank, self.global_step)
        if self.rank.is_main:
            keep_epochs_before(self.run_dir.epochs, self.start_epoch)
        keep_epochs_before(self.run_dir.metrics(self.rank.rank), self.start_epoch)

    def _ps_summary(self, done: int, dead: int) -> dict[str, Any]:
        from scaletrain.ps.stats import summarize

        servers = [json.loads(self.run_dir.ps_server(s).read_text()) for s in range(self.cfg.ps_servers)]
        ps = {**summarize(servers), "workers": self.rank.world_size, "workers_finished": done, "workers_died": dead}
        out: dict[str, Any] = {"ps": ps}
        if self.independent:
            out["replicas_identical"] = None  # asynchronous replicas differ by design
        return out

    def _placement(self) -> dict[str, Any]:
        """How this run sat on its machine: what tells a starved or oversubscribed CPU run (docs/metrics.md)."""
        cpu = self.device.type == "cpu"
        return {"device": self.device.type, "local_world_size": self.rank.local_world_size,
                "threads_per_rank": torch.get_num_threads() if cpu else None,
                "cpu_cores": machine_cores() if cpu else None}

    def _summary(self, status: str, wall_time: float, digests: list[str]) -> dict[str, Any]:
        cfg, world, h = self.cfg, self.rank.world_size, self.history
        records = read_jsonl(self.run_dir.metrics(0))
        summary = {
            "status": status, "model": cfg.model, "dataset": cfg.dataset, "world_size": world,
            "global_batch": cfg.batch_size * world, "epochs": len(h.epoch_times_s), "epochs_planned": cfg.epochs,
            "top1": h.top1, "top5": h.top5, "best_top1": h.best_top1, "epoch_times_s": h.epoch_times_s,
            "samples_per_s": steady_samples_per_s(records, world, self.steps_per_epoch),
            "effective_lr": peak_lr(cfg, world), "precision": cfg.precision,
            "device": self.device.type if self.device.type == "cpu" else torch.cuda.get_device_name(self.device),
            "backend": self.backend, "steps": self.global_step, "train_samples": len(self.data.train),
            "val_samples": len(self.data.val), "bad_images_skipped": h.bad_images_skipped,
            "bad_images": sorted(self.bad_paths)[:20],
            "param_digests": digests, "replicas_identical": len(set(digests)) == 1,
            **{k: v for k, v in self._placement().items() if k != "device"},
            "wall_time_s": wall_time, "scaletrain_version": scaletrain.__version__,
            "torch_version": torch.__version__, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        return summary


def _ps_client(cfg: TrainConfig, links, model: torch.nn.Module, steps_per_epoch: int):
    from scaletrain.ps.client import AsyncClient, SyncClient

    seed = cfg.seed + 7919 * links.index  # QSGD's random stream differs per worker
    if cfg.strategy == "ps-sync":
        return SyncClient(links, model, steps_per_epoch, cfg.compress, seed)
    return AsyncClient(links, model, steps_per_epoch, cfg.ps_fetch, cfg.ps_push, cfg.compress, seed)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _sync_buffers(model: torch.nn.Module) -> None:
    """Broadcast rank 0's buffers (BN running statistics), which DDP only syncs at the next forward."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        for buf in model.buffers():
            dist.broadcast(buf, src=0)


def _json_line(record: dict[str, Any]) -> str:
    return json.dumps(record) + "\n"


def param_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's bytes: equal on all ranks iff the replicas are bit-identical."""
    h = hashlib.sha256()
    for p in model.parameters():
        # raw bytes of any dtype (bf16 has no numpy type); note: a device-to-host copy, once per run
        h.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
