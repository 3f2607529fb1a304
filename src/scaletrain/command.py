"""A command of the command line: its name, its one-line help, the function that adds its flags and the one
that runs it. Each command's module declares its own in `COMMANDS`; cli.py builds the parser from them and
runs the one named, so a command is added in its module and one line of cli.COMMAND_MODULES."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
