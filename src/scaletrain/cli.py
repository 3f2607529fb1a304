"""Command line: `scaletrain COMMAND ...`, built from the command table (each command's module declares its
own `COMMANDS`, scaletrain/command.py); bad input becomes one line and exit code 2."""

from __future__ import annotations

import argparse
import importlib
import sys

from scaletrain.distributed.env import quiet_torch_cpp_logs

quiet_torch_cpp_logs()  # before anything imports torch

import scaletrain  # noqa: E402
from scaletrain.command import Command  # noqa: E402
from scaletrain.config.flags import OneLineParser  # noqa: E402
from scaletrain.distributed.allocator import settle as settle_allocator  # noqa: E402
from scaletrain.distributed.launch.spawned import refuse_in_spawned_import  # noqa: E402
from scaletrain.errors import UserError  # noqa: E402

# the modules whose COMMANDS make the command line, in the order `scaletrain --help` lists them
COMMAND_MODULES = ("scaletrain.train.cli", "scaletrain.study.cli", "scaletrain.report.cli", "scaletrain.commbench.cli",
                   "scaletrain.testbed.cli", "scaletrain.predict.calibrate_cli", "scaletrain.predict.cli",
                   "scaletrain.plan.cli", "scaletrain.validate.cli", "scaletrain.graph.cli", "scaletrain.split.cli", "scaletrain.slurm.cli",
                   "scaletrain.doctor.cli", "scaletrain.watch.cli", "scaletrain.models.cli", "scaletrain.data.cli")


def commands() -> dict[str, Command]:
    """Every command by name, in COMMAND_MODULES' order."""
    table: dict[str, Command] = {}
    for module in COMMAND_MODULES:
        for command in importlib.import_module(module).COMMANDS:
            assert command.name not in table, f"two commands named {command.name}"
            table[command.name] = command
    return table


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="scaletrain", description=scaletrain.__doc__)
    parser.add_argument("--version", action="version", version=f"scaletrain {scaletrain.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in commands().values():
        command.add_arguments(sub.add_parser(command.name, help=command.help))
    parser.commands = sub.choices  # name -> the command's parser, for its own error line
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse; an unknown flag is reported by its command's parser (`see scaletrain study --help`)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    refuse_in_spawned_import("scaletrain.cli.main()")  # a script's unguarded call, run again by a worker
    args = parse_args(argv)
    settle_allocator()  # before anything is timed or allocated for training (distributed/allocator.py)
    try:
        return commands()[args.command].run(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
