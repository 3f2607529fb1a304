"""`scaletrain models`: the built-in models with their parameters and forward FLOPs at an image size."""

from __future__ import annotations

import argparse

from scaletrain.command import Command
from scaletrain.errors import UserError


def add_models_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--in-channels", type=int, default=3)
    p.add_argument("--num-classes", type=int, default=10)


def run_models(args: argparse.Namespace) -> int:
    from scaletrain.console.summary import print_models
    from scaletrain.models import model_rows

    if min(args.image_size, args.in_channels, args.num_classes) < 1:
        raise UserError("--image-size, --in-channels and --num-classes must be at least 1")
    print_models(model_rows(image_size=args.image_size, in_channels=args.in_channels,
                            num_classes=args.num_classes), args.image_size)
    return 0


COMMANDS = (
    Command("models", "list the models with parameters and forward FLOPs", add_models_args, run_models),
)
