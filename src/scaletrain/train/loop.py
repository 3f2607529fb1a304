"""The training loop: one process per device (or CPU rank), reading like the algorithm it runs.

It knows no strategy by name: how gradients are aggregated, who evaluates, what the checkpoint and the
summary gain, all come from the strategy it is handed (comm/strategy.py). It renders nothing either: what
it reports goes to the sinks it is handed (console/sink.py, export/tensorboard.py), each with

    epoch_start(epoch, epochs, steps, done)   step(record)   epoch_end(record)  (rank 0's, after evaluation)   close()
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from scaletrain.comm.strategy import Strategy
from scaletrain.config import TrainConfig
from scaletrain.data import DelayedDataset, collate
from scaletrain.distributed.group import all_reduce_max, barrier, gather_objects
from scaletrain.errors import UserError
from scaletrain.perf.precision import AUTOCAST, to_device
from scaletrain.profiler import StepProfiler
from scaletrain.rundir import RunDir, append_jsonl, keep_epochs_before, keep_steps_before
from scaletrain.train import checkpoint, summary
from scaletrain.train.build import build_data_and_model
from scaletrain.train.recompute import plan_units
from scaletrain.train.evaluate import ShardSampler
from scaletrain.train.optim import build_optimizer, build_scheduler, resume_optimizer
from scaletrain.train.sampler import ResumableSampler



@dataclass
class History:
    """Per-epoch results that must survive a resume (they live in the checkpoint)."""

    epoch_times_s: list[float] = field(default_factory=list)
    top1: float | None = None
    top5: float | None = None
    best_top1: float | None = None
    bad_images_skipped: int = 0


class Trainer:
    def __init__(self, cfg: TrainConfig, strategy: Strategy, sinks: list | tuple = ()) -> None:
        self.cfg, self.strategy, self.sinks = cfg, strategy, list(sinks)
        self.rank, self.device, self.backend = strategy.rank, strategy.device, strategy.backend
        rank, device = self.rank, self.device
        self.run_dir = RunDir(Path(cfg.launch.out))
        self.autocast = AUTOCAST[cfg.model.precision]
        self.data, model = build_data_and_model(cfg)  # same seed on every rank: identical initial weights
        if cfg.model.sync_bn:
            if device.type != "cuda":
                raise UserError("--sync-bn needs CUDA (PyTorch's SyncBatchNorm has no CPU kernel): drop --sync-bn")
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        self.model = strategy.place(model)
        # the data-parallel replica this rank is: its shard of each epoch, and how many share the global batch
        self.replica, self.replicas = strategy.replica()
        world = self.replicas
        inject = cfg.faults.injection
        self.slow_s = inject.slow_rank_s if inject.slow_rank == rank.rank else 0.0
        self.kill_step = inject.kill_step if inject.kill_rank == rank.rank else None
        self.stop_step = inject.stop_step if inject.stop_rank == rank.rank else None
        if inject.data_s:
            self.data = dataclasses.replace(self.data, train=DelayedDataset(self.data.train, inject.data_s))

        self.sampler = ResumableSampler(self.data.train, num_replicas=world, rank=self.replica,
                                        shuffle=True, seed=cfg.optim.seed)
        self.loader_rng = torch.Generator()
        # drop_last: every step has the full global batch, as the linear scaling rule assumes
        self.train_loader = DataLoader(self.data.train, batch_size=cfg.optim.batch_size, sampler=self.sampler,
                                       num_workers=cfg.data.workers, collate_fn=collate, drop_last=True,
                                       pin_memory=device.type == "cuda", generator=self.loader_rng,
                                       persistent_workers=cfg.data.persistent_workers and cfg.data.workers > 0)
        self.val_shard = strategy.eval_shard()  # None: this rank does not evaluate
        self.val_loader = DataLoader(self.data.val, batch_size=max(cfg.optim.batch_size, 256),
                                     sampler=ShardSampler(len(self.data.val), *(self.val_shard or (0, 1))),
                                     num_workers=cfg.data.workers, collate_fn=collate,
                                     pin_memory=device.type == "cuda",
                                     persistent_workers=cfg.data.persistent_workers and cfg.data.workers > 0)
        self.steps_per_epoch = len(self.train_loader)
        if self.steps_per_epoch == 0:
            raise UserError(f"--batch-size {cfg.optim.batch_size} x {world} ranks is more than the "
                            f"{len(self.data.train)} training samples: lower --batch-size")
        # what forward and backward run through: DDP, or the model itself (collective: every rank, here)
        sample_shape = (self.data.in_channels, self.data.image_size, self.data.image_size)
        # activation checkpointing's blocks, read before the strategy wraps the model (and set once it has)
        value = self._checkpointing(sample_shape)
        units = plan_units(self.model, sample_shape, value) if value != "none" else []
        self.module = strategy.wrap(self.model, self.steps_per_epoch, sample_shape)
        self.checkpointed = strategy.checkpoint_blocks(self.model, units) if units else []

        # a strategy whose servers own the update never steps this optimizer; it still tracks the schedule
        self.optimizer = build_optimizer(cfg.optim, self.model, world)
        self.scheduler = build_scheduler(cfg.optim, self.optimizer, self.steps_per_epoch, world)
        self.scaler = torch.amp.GradScaler(device.type) if cfg.model.precision == "fp16" else None
        self.criterion = torch.nn.CrossEntropyLoss()
        self.history = History()
        self.start_epoch = 0
        self.global_step = 0
        # a checkpoint written mid-epoch: steps of start_epoch already trained, and that part's loss and time
        self.resume_step, self.partial = 0, {"loss_sum": 0.0, "time_s": 0.0}
        # ranks agree on a preemption request (RUN/preempt) with one tiny all-reduce every 10 steps (about
        # 0.2 ms on gloo here: every step would cost 2% of a 10 ms step; on CUDA its result waits for the GPU)
        self.preempt_every = 10
        self.checkpoint_s: list[float] = []  # this invocation's checkpoints: seconds each held the ranks
        self.bad_paths: set[str] = set()
        if cfg.launch.resume:
            self._restore()
        else:
            torch.manual_seed(cfg.optim.seed + 1 + self.replica)  # per-replica augmentation streams
        self.step_count = self.global_step  # steps taken, counted as they are taken (records may lag one)
        profiled = strategy.profiled()
        # collective (aligns the ranks' clocks): every rank builds it here
        self.prof = StepProfiler(cfg.launch.out, profiled.module, enabled=cfg.profile.step_profiler == "on",
                                 rank=rank.rank, world_size=rank.world_size, replicas=self.replicas,
                                 device=device, first_step=self.global_step, inject_comm_s=inject.comm_s,
                                 comm_hook=profiled.hook, comm_state=profiled.state, keep_spans=profiled.spans,
                                 torch_profile=cfg.profile.torch_profile_steps)

    def _checkpointing(self, sample_shape: tuple[int, ...]) -> str:
        """--checkpoint-activations, `auto` resolved as the launcher resolved it (the same plan in every rank)."""
        from scaletrain.comm.memory import resolve_checkpointing
        from scaletrain.models import build_model

        cfg, data = self.cfg, self.data
        if cfg.model.checkpoint_activations != "auto":
            return cfg.model.checkpoint_activations

        def factory():
            return build_model(cfg.model.name, num_classes=data.num_classes, in_channels=data.in_channels,
                               image_size=data.image_size, stem=cfg.model.stem, width=cfg.model.width)

        return resolve_checkpointing(cfg, factory, sample_shape, self.device.type).model.checkpoint_activations

    # ---------------------------------------------------------------- training
    def fit(self) -> dict[str, Any] | None:
        cfg, main = self.cfg, self.rank.is_main
        t_run = time.perf_counter()
        last = cfg.optim.epochs if cfg.launch.stop_after is None else min(cfg.optim.epochs,
                                                                          self.start_epoch + cfg.launch.stop_after)
        preempted = False
        try:
            for epoch in range(self.start_epoch, last):
                epoch_time = self.train_epoch(epoch)
                if epoch_time is None:  # preempted mid-epoch: checkpointed at this step
                    preempted = True
                    break
                result = None
                due = (epoch + 1) % cfg.optim.eval_every == 0 or epoch + 1 == cfg.optim.epochs
                if due and self.val_shard is not None:
                    self.strategy.before_eval()
                    result = self.strategy.evaluate(self.model, self.val_loader, self.autocast,
                                                    self.data.num_classes)
                self._end_epoch(epoch, epoch_time, result)
                if epoch + 1 < last and self._preempt_requested():  # every strategy agrees at an epoch's end
                    preempted = True
                    break
        finally:
            for sink in self.sinks:
                sink.close()
            self.prof.close()
        status = "preempted" if preempted else "completed" if last == cfg.optim.epochs else "stopped"
        ended = self.strategy.finish(chief=main)  # ends the exchange; its summary entries, on rank 0
        digests = gather_objects(self.strategy.digest(self.model))
        self.bad_paths = set().union(*gather_objects(self.bad_paths))
        placement = summary.placement(self.device, self.rank) | summary.exchange(self.strategy, self.model)
        # collective: rank 0 gets phases, stragglers and diagnosis from every rank's file
        analysis = self.prof.finish_analysis(config={**cfg.to_dict(), **placement})
        result = None
        if main:
            settled = ((analysis or {}).get("steady") or {}).get("heap_settled_step")
            result = summary.run_summary(self, status, time.perf_counter() - t_run, digests, placement,
                                         settled) | ended
            result |= analysis
            summary.write(self.run_dir, result)
        barrier()  # all ranks leave together: a rank tearing down gloo while a peer still uses it can abort
        return result

    def train_epoch(self, epoch: int) -> float | None:
        """One pass over this rank's shard; returns the epoch's training wall time, or None when a
        preemption request ended it part way (after a checkpoint at that step)."""
        cfg, prof = self.cfg, self.prof
        done = self.resume_step if epoch == self.start_epoch else 0  # steps a mid-epoch checkpoint trained
        self.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        self.sampler.skip = done * cfg.optim.batch_size
        # loader workers draw their seeds from this generator: fixed per (seed, epoch, rank) for resumes
        self.loader_rng.manual_seed(cfg.optim.seed * 1_000_003 + epoch * 1009 + self.replica)
        self.module.train()
        for sink in self.sinks:
            sink.epoch_start(epoch, cfg.optim.epochs, self.steps_per_epoch, done)
        t_start = time.perf_counter() - (self.partial["time_s"] if done else 0.0)
        self.loss_sum = self.partial["loss_sum"] if done else 0.0
        for i, (x, y, bad) in enumerate(prof.data(self.train_loader), start=done):  # blocked here: data_wait
            if bad:
                self._bad_images(bad)
            with prof.phase("h2d"):
                x, y = to_device(x, self.device), to_device(y, self.device)
            # forward and backward (with DDP, gradient buckets are all-reduced while backward runs)
            loss = self.strategy.forward_backward(x, y, self._loss, self.optimizer, self.scaler, prof)
            # the update: the optimizer's step, or an exchange with servers that own the update
            extra = self.strategy.step(self.optimizer, self.scaler, prof, epoch * self.steps_per_epoch + i)
            lr = self.optimizer.param_groups[0]["lr"]
            with warnings.catch_warnings():  # a strategy whose servers own the update never steps the optimizer
                warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
                self.scheduler.step()
            if self.kill_step is not None and epoch * self.steps_per_epoch + i + 1 >= self.kill_step:
                os.kill(os.getpid(), signal.SIGKILL)  # --inject kill-rank: this worker dies, as a crash would
            if self.stop_step is not None and epoch * self.steps_per_epoch + i + 1 == self.stop_step:
                os.kill(os.getpid(), signal.SIGSTOP)  # --inject stop-rank: this worker hangs, its peers wait
            # records come back resolved: at once on CPU, one step late on CUDA (no GPU sync per step)
            for record in prof.step_end(loss=loss.detach(), samples=len(y), epoch=epoch, step_in_epoch=i,
                                        epoch_steps=self.steps_per_epoch, lr=lr, **extra):
                self._after_step(record)
            self.step_count += 1
            if i + 1 < self.steps_per_epoch and self._within_epoch(epoch, i + 1, t_start):
                self.sampler.skip = 0
                return None
        self.sampler.skip = 0
        for record in prof.flush():  # on CUDA: the last step's record (waits for the GPU, once per epoch)
            self._after_step(record)
        self.epoch_loss = self.loss_sum / self.steps_per_epoch
        return time.perf_counter() - t_start

    def _within_epoch(self, epoch: int, done: int, t_start: float) -> bool:
        """After step `done` of `epoch` (not its last): checkpoint every --checkpoint-every steps and on a
        preemption request; True when the request ends the run here."""
        every = self.cfg.launch.checkpoint_every
        preempt = (self.strategy.lockstep and self.step_count % self.preempt_every == 0
                   and self._preempt_requested())
        if preempt or (every and self.step_count % every == 0):
            for record in self.prof.flush():  # on CUDA: the last step's record, so the counts are complete
                self._after_step(record)
            self._checkpoint_within(epoch, done, time.perf_counter() - t_start)
        return preempt

    def _preempt_requested(self) -> bool:
        """Whether any rank sees RUN/preempt (collective: every rank asks at the same step)."""
        wanted = torch.tensor([float(self.run_dir.preempt.exists())], device=self.device)
        return bool(all_reduce_max(wanted).item() > 0)

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The forward pass through the strategy's module, under autocast."""
        if self.slow_s:
            time.sleep(self.slow_s)  # --inject slow-rank: this rank computes slower than its peers
        with torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            return self.criterion(self.module(x), y)

    def _after_step(self, record: dict[str, Any]) -> None:
        loss = record["loss"]
        if not math.isfinite(loss) and self.scaler is None:
            raise UserError(f"training diverged: loss is {loss} at epoch {record['epoch'] + 1} step "
                            f"{record['step_in_epoch'] + 1} (lr {record['lr']:.4g}): lower --lr or add --warmup-epochs")
        for sink in self.sinks:
            sink.step(record)
        self.global_step = record["step"] + 1
        self.loss_sum += loss

    def _bad_images(self, bad: list[str]) -> None:
        if self.cfg.data.bad_images == "error":
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
        t0 = time.perf_counter()
        rngs = gather_objects(checkpoint.rng_state())  # every rank's RNG, so a resume replays all of them
        strategy_state = self.strategy.state_dict(chief=self.rank.is_main)  # collective
        skipped = gather_objects(h.bad_images_skipped)
        if self.rank.is_main:
            self._save_checkpoint(epoch + 1, rngs, strategy_state)
            record = {"epoch": epoch, "epoch_time_s": epoch_time, "train_loss": self.epoch_loss,
                      "lr": self.optimizer.param_groups[0]["lr"], "bad_images_skipped": sum(skipped)}
            if result is not None:
                record |= {"top1": result.top1, "top5": result.top5, "val_loss": result.loss}
            append_jsonl(self.run_dir.epochs, record)
            for sink in self.sinks:
                sink.epoch_end(record)
        barrier()  # nobody races ahead while rank 0 writes the checkpoint
        self.checkpoint_s.append(time.perf_counter() - t0)

    def _checkpoint_within(self, epoch: int, done: int, elapsed_s: float) -> None:
        """A checkpoint after step `done` of `epoch` (collective): what a resume needs to go on from the
        next step as if never stopped: every rank's RNG, and the epoch's loss and time so far."""
        t0 = time.perf_counter()
        rngs = gather_objects(checkpoint.rng_state())
        self.strategy.before_eval()  # the saved model is up to date (a pipeline's stages gathered, ...)
        strategy_state = self.strategy.state_dict(chief=self.rank.is_main)
        if self.rank.is_main:
            self._save_checkpoint(epoch, rngs, strategy_state,
                                  within={"step_in_epoch": done, "loss_sum": self.loss_sum, "time_s": elapsed_s})
        barrier()
        self.checkpoint_s.append(time.perf_counter() - t0)

    def _save_checkpoint(self, epochs_done: int, rngs: list, strategy_state: dict[str, Any],
                         within: dict[str, Any] | None = None) -> None:
        checkpoint.save_atomic({
            "format": checkpoint.FORMAT, "epoch": epochs_done, "global_step": self.global_step,
            "within_epoch": within,  # None at an epoch's end
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": rngs, "world_size": self.rank.world_size, "config": self.cfg.to_dict(),
            "history": vars(self.history).copy(), **strategy_state,  # the strategy's entries (docs/run-directory.md)
        }, self.run_dir.checkpoint)

    def _restore(self) -> None:
        ckpt = checkpoint.load(self.run_dir.checkpoint)
        checkpoint.check_compatible(ckpt, self.cfg.model.name, self.cfg.data.dataset, self.run_dir.checkpoint)
        try:
            self.strategy.load_model_state(self.model, ckpt["model"])
        except RuntimeError:
            raise UserError(f"checkpoint {self.run_dir.checkpoint} does not fit this model (its shapes differ: "
                            "another --width/--image-size/--stem?): resume with the original settings") from None
        # the optimizer's state continues; its settings and the LR schedule are this invocation's
        # (a resume with --epochs 3 re-plans the schedule for 3 epochs, from the current step)
        self.start_epoch, self.global_step = ckpt["epoch"], ckpt["global_step"]
        within = ckpt.get("within_epoch")
        if within:  # (written by as many processes as this run has: the launcher checked)
            self.resume_step = within["step_in_epoch"]
            self.partial = {"loss_sum": within["loss_sum"], "time_s": within["time_s"]}
        # the schedule's position counts epochs done, in this invocation's steps per epoch (the same as
        # global_step unless the number of processes changed), and the steps of a part-trained epoch
        resume_optimizer(self.optimizer, self.scheduler, ckpt["optimizer"],
                         self.start_epoch * self.steps_per_epoch + self.resume_step,
                         load=lambda state: self.strategy.load_optimizer_state(self.model, self.optimizer, state))
        if self.scaler is not None and ckpt["scaler"] is not None:
            self.scaler.load_state_dict(ckpt["scaler"])
        self.history = History(**ckpt["history"])
        # (ranks that share no group, as asynchronous workers, checkpoint worker 0's RNG alone)
        if ckpt["world_size"] == self.rank.world_size and self.rank.rank < len(ckpt["rng"]):
            checkpoint.set_rng_state(ckpt["rng"][self.rank.rank])
        else:  # a different world size cannot replay the same data order anyway
            torch.manual_seed(self.cfg.optim.seed + 1 + self.replica + 7919 * self.start_epoch)
        self.strategy.load_state_dict(ckpt, self.global_step)
        if self.rank.is_main:
            keep_epochs_before(self.run_dir.epochs, self.start_epoch)
        keep_steps_before(self.run_dir.metrics(self.rank.rank), self.global_step)
