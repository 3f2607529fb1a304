"""Optimizers and the learning-rate schedule: linear scaling rule, gradual warm-up, then decay."""

from __future__ import annotations

import math

import torch

from scaletrain.config.sections import OptimConfig


def peak_lr(cfg: OptimConfig, world_size: int) -> float:
    """The LR after warm-up: lr, or lr x global batch / ref batch under the linear scaling rule."""
    if not cfg.scale_lr:
        return cfg.lr
    return cfg.lr * cfg.batch_size * world_size / cfg.ref_batch


def build_optimizer(cfg: OptimConfig, model: torch.nn.Module, world_size: int) -> torch.optim.Optimizer:
    """The optimizer, created at the peak LR (the schedule multiplies it down)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return optimizer_for(cfg, params, [p.ndim > 1 for p in params], peak_lr(cfg, world_size))


def optimizer_for(cfg: OptimConfig, tensors: list[torch.Tensor], decay: list[bool], lr: float,
                  kind: str | None = None) -> torch.optim.Optimizer:
    """`kind` (default --optimizer) over `tensors`, weight decay only where `decay` says (a parameter
    server's shard passes the pieces it holds, each flagged like the parameter it was cut from)."""
    # Weight decay on BN/bias parameters hurts large-batch training (Goyal et al. 2017, Jia et al. 2018).
    groups = [{"params": [t for t, d in zip(tensors, decay) if d], "weight_decay": cfg.weight_decay},
              {"params": [t for t, d in zip(tensors, decay) if not d], "weight_decay": 0.0}]
    kind = kind or cfg.optimizer
    if kind in ("sgd", "nesterov"):
        return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, nesterov=kind == "nesterov")
    if kind == "plain-sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.0)
    if kind == "adagrad":
        return torch.optim.Adagrad(groups, lr=lr)
    return torch.optim.AdamW(groups, lr=lr, betas=(cfg.momentum, 0.999))


class LRSchedule:
    """Per-step multiplier of the peak LR; picklable so LambdaLR state round-trips through checkpoints."""

    def __init__(self, cfg: OptimConfig, steps_per_epoch: int, world_size: int) -> None:
        self.total = max(1, cfg.epochs * steps_per_epoch)
        self.warmup = int(round(cfg.warmup_epochs * steps_per_epoch))
        # Warm-up starts at the unscaled base LR and reaches the scaled one (Goyal et al. 2017, sec. 2.2).
        self.start = min(1.0, cfg.lr / peak_lr(cfg, world_size))
        self.kind = cfg.schedule

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return self.start + (1.0 - self.start) * step / self.warmup
        if self.kind == "constant":
            return 1.0
        progress = (step - self.warmup) / max(1, self.total - self.warmup)
        if self.kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 0.1 ** ((progress >= 0.5) + (progress >= 0.75))


def build_scheduler(cfg: OptimConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int,
                    world_size: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, LRSchedule(cfg, steps_per_epoch, world_size))


def resume_optimizer(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
                     state: dict, step: int, load=None) -> None:
    """Load a checkpoint's optimizer state (momentum buffers, Adagrad sums, ...) but keep this invocation's
    settings: the groups' momentum, weight decay, ... as built, and the schedule as planned for the
    configured epochs, continued at `step`.

    `optimizer.load_state_dict` alone brings back the saved groups' hyperparameters, and LambdaLR's
    state its total step count: a resume with other --epochs or --lr would silently keep the old ones
    (a 2-epoch run extended to 3 trained its third epoch at LR 0). `load` loads the state (default:
    `optimizer.load_state_dict`)."""
    built = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    (load or optimizer.load_state_dict)(state)  # `load`: the strategy's, for state in another layout
    for group, settings, base_lr, fn in zip(optimizer.param_groups, built, scheduler.base_lrs,
                                            scheduler.lr_lambdas):
        group.update(settings)
        group["lr"] = base_lr * fn(step)
    scheduler.last_epoch = step
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
