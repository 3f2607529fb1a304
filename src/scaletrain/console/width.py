"""The console a command prints its tables and lines to: on a terminal, the terminal's width; written to a
file or a pipe (a log, `| less`, `> out.txt`), wide enough that no table is cut. rich assumes 80 columns
there, and a table wider than that loses its last columns (predict's speedup and efficiency)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

PIPED_WIDTH = 1000
"""Columns when the output is not a terminal: a table keeps its own width below this (rich does not pad a
table to the console's width), and a line longer than this wraps."""


def output_console(**options: Any) -> Console:
    """`Console(**options)`, as wide as PIPED_WIDTH when it does not write to a terminal."""
    console = Console(**options)
    return console if console.is_terminal else Console(width=PIPED_WIDTH, **options)
