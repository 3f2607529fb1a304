"""`scaletrain train`: its flags (config/flags.py, generated from the config's fields) and its launch."""

from __future__ import annotations

import argparse

from scaletrain.command import Command
from scaletrain.config import TrainConfig, resolve_train_config
from scaletrain.config.flags import add_train_args


def train_config(args: argparse.Namespace) -> TrainConfig:
    """Defaults < the run's saved config (on --resume) < --config file < flags."""
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    return resolve_train_config(overrides, args.config)


def run_train(args: argparse.Namespace) -> int:
    from scaletrain.distributed.launch.start import train

    return train(train_config(args))


COMMANDS = (
    Command("train", "train a model with data parallelism (DDP)", add_train_args, run_train),
)
