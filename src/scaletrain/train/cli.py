"""`scaletrain train`: its flags (config/flags.py, generated from the config's fields) and its launch."""

from __future__ import annotations

import argparse

from scaletrain.command import Command
from scaletrain.errors import UserError
from scaletrain.config import TrainConfig, resolve_train_config
from scaletrain.config.flags import add_train_args


def train_config(args: argparse.Namespace) -> TrainConfig:
    """Defaults < the run's saved config (on --resume) < --config file < the plan's choice (--plan) < flags."""
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "config", "plan", "plan_rank")}
    planned = None
    if getattr(args, "plan", None) == "auto":
        from scaletrain.plan.auto import auto_settings

        planned = auto_settings(overrides, args.config, getattr(args, "plan_rank", None))
    elif getattr(args, "plan", None):
        from scaletrain.plan.chosen import planned_settings

        planned = planned_settings(args.plan, getattr(args, "plan_rank", None))
    elif getattr(args, "plan_rank", None) is not None:
        raise UserError(f"--plan-rank {args.plan_rank} picks a candidate of a plan: add --plan DIR")
    return resolve_train_config(overrides, args.config, planned)


def add_args(p: argparse.ArgumentParser) -> None:
    add_train_args(p)
    p.add_argument("--plan", metavar="DIR|auto", default=argparse.SUPPRESS,
                   help="run the configuration `scaletrain plan --out DIR` chose (its strategy, layout, batch, "
                        "workers, precision, ...); flags override it. auto: plan this run here first, on this "
                        "machine's calibration, the settings given fixing their axes (one node)")
    p.add_argument("--plan-rank", type=int, default=argparse.SUPPRESS, metavar="K",
                   help="with --plan: run the plan's K-th candidate instead of the chosen one (its first, or "
                        "the measured fastest of `plan --validate`)")


def run_train(args: argparse.Namespace) -> int:
    from scaletrain.distributed.launch.start import train

    return train(train_config(args))


COMMANDS = (
    Command("train", "train a model with data parallelism (DDP)", add_args, run_train),
)
