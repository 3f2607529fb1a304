"""`scaletrain watch RUN_DIR`: a live view of a run from its run directory alone (docs/watch.md)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from scaletrain.command import Command
from scaletrain.errors import UserError

PIPED_WIDTH = 140  # columns of a frame written to a file or a pipe (a terminal uses its own width)


def add_watch_args(p: argparse.ArgumentParser) -> None:
    from scaletrain.watch.reader import DEFAULT_WINDOW

    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (the run's --out), on any node that "
                                                      "sees it")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                   help="seconds between refreshes (default: 2)")
    p.add_argument("--once", action="store_true", help="print one frame and exit (for scripts)")
    p.add_argument("--html", metavar="FILE", help="also write the view to FILE as an HTML page that reloads "
                                                   "itself every --interval seconds (rewritten atomically)")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                   help=f"phases, stragglers and diagnosis over each rank's last STEPS steps; 0: all steps "
                        f"(default: {DEFAULT_WINDOW})", metavar="STEPS")
    p.add_argument("--stale", type=float, default=None, metavar="SECONDS",
                   help="call a running run stalled after this long without a new step (default: 3x the "
                        "longest pause between two of its steps, at least 100 steps and 120 s)")


def run_watch(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from scaletrain.watch.html import write_page
    from scaletrain.watch.reader import RunReader, open_run
    from scaletrain.watch.terminal import frame

    if not 0 < args.interval < math.inf:
        raise UserError(f"--interval must be a positive number of seconds (got {args.interval:g})")
    if args.window < 0:
        raise UserError(f"--window must be 0 (all steps) or a number of steps (got {args.window})")
    if args.stale is not None and not 0 < args.stale < math.inf:
        raise UserError(f"--stale must be a positive number of seconds (got {args.stale:g})")
    html = Path(args.html) if args.html else None
    if html is not None and not html.parent.is_dir():
        raise UserError(f"--html {args.html}: folder {html.parent} does not exist: create it or write elsewhere")
    reader = RunReader(open_run(args.run_dir), window=args.window)
    console = Console() if sys.stdout.isatty() else Console(width=PIPED_WIDTH)
    live_hint = f"   every {args.interval:g} s; Ctrl-C stops watching (not the run)"

    def show(live: bool):
        """Read what is new; the HTML page rewritten; the terminal's frame (with the hint while live)."""
        snap = reader.snapshot(stale_s=args.stale)
        if html is not None:
            try:
                write_page(html, frame(snap), args.interval, f"{snap.status}: {snap.root}")
            except OSError as e:
                raise UserError(f"cannot write --html {html} ({e.strerror}): choose a writable place") from None
        return snap, frame(snap, live_hint if live and not snap.ended else "")

    if args.once:
        console.print(show(live=False)[1])
        return 0
    snap, view = show(live=True)
    try:
        with Live(view, console=console, auto_refresh=False, redirect_stdout=False) as live:
            while not snap.ended:
                time.sleep(args.interval)
                snap, view = show(live=True)
                live.update(view, refresh=True)
    except KeyboardInterrupt:
        pass
    return 0


COMMANDS = (
    Command("watch", "a live view of a running job from its run directory (terminal, or a "
            "self-refreshing HTML page)",
            add_watch_args, run_watch),
)
