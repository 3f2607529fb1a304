"""`scaletrain testbed up | status | down | run`: a virtual cluster of network namespaces with shaped links."""

from __future__ import annotations

import argparse
import os

from scaletrain.command import Command
from scaletrain.errors import UserError


def add_testbed_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Hosts as network namespaces joined by a bridge, each link rate-limited and delayed "
                     "with tc, so a multi-node job really crosses shaped links (root only; docs/testbed.md).")
    sub = p.add_subparsers(dest="testbed_command", required=True)
    up = sub.add_parser("up", help="create the hosts and links")
    _shape_args(up, required=True)
    sub.add_parser("status", help="hosts, addresses, link shaping, bytes sent")
    sub.add_parser("down", help="remove every testbed namespace (also a half-built testbed)")
    run = sub.add_parser("run", help="run a command on every host (scaletrain train/commbench/doctor get their node "
                                     "flags); with --hosts, on a testbed made for it and removed afterwards")
    _shape_args(run, required=False)
    run.add_argument("--cores-per-host", type=int, default=None, metavar="N",
                     help="cores each host's processes may use (SCALETRAIN_CORES; each host pinned to its own CPUs "
                          "where they fit); default: the machine's cores // hosts, at least 1")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command, e.g. -- scaletrain train ...")


RATE, DELAY = "1gbit", "0ms"


def _shape_args(p: argparse.ArgumentParser, required: bool) -> None:
    # `run` on a testbed that is up takes its shape: a --rate or --delay given there must be the same
    p.add_argument("--hosts", type=int, required=required, help="number of hosts (2..32)")
    p.add_argument("--rate", default=RATE if required else None,
                   help=f"link rate in bits per second, as tc writes it (100mbit, 10gbit; default: {RATE})")
    p.add_argument("--delay", default=DELAY if required else None,
                   help=f"one-way delay per link, e.g. 0.2ms (needs the kernel's netem; default: {DELAY}, rate limit only)")


def run_testbed(args: argparse.Namespace) -> int:
    from scaletrain.console.width import output_console
    from scaletrain.testbed import net
    from scaletrain.testbed.plan import make_testbed

    console = output_console(highlight=False)
    net.require_root()
    if args.testbed_command == "up":
        tb = make_testbed(args.hosts, args.rate, args.delay)
        net.up(tb)
        console.print(f"testbed up: {tb.hosts} hosts ({', '.join(tb.address(i) for i in range(tb.hosts))}), "
                      f"links {tb.rate}, delay {tb.delay}; remove with  scaletrain testbed down")
        return 0
    if args.testbed_command == "down":
        removed = net.down()
        console.print(f"testbed down: removed {', '.join(removed)}" if removed else "no testbed was up")
        return 0
    if args.testbed_command == "status":
        return _status(console, net)
    return _run(console, net, args, make_testbed)


def _status(console, net) -> int:
    from scaletrain.grid import Grid, rich_table

    tb = net.current()
    if tb is None:
        console.print("no testbed is up: scaletrain testbed up --hosts 2")
        return 0
    sent = net.tx_bytes(tb)
    grid = Grid(f"testbed: {tb.hosts} hosts, {tb.rate}, delay {tb.delay}",
                ["host", "address", "link shaping", "bytes sent"], text_columns=(0, 1, 2),
                rows=[[tb.host(i), tb.address(i), net.qdisc(tb, i), f"{sent[tb.host(i)]:,}"]
                      for i in range(tb.hosts)])
    console.print(rich_table(grid))
    return 0


def _run(console, net, args, make_testbed) -> int:
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        raise UserError("testbed run needs a command after --, e.g. scaletrain testbed run -- scaletrain train "
                        "--nproc 1 --out runs/x")
    from scaletrain.testbed.cores import share_cores
    from scaletrain.testbed.run import resolve_command, run_on_hosts

    command = resolve_command(command)
    tb, made = net.current(), False
    if tb is None:
        if args.hosts is None:
            raise UserError("no testbed is up: run `scaletrain testbed up --hosts 2` first, or give --hosts to "
                            "make one for this command only")
        tb, made = make_testbed(args.hosts, args.rate or RATE, args.delay or DELAY), True
    else:
        asked = make_testbed(args.hosts or tb.hosts, args.rate or RATE, args.delay or DELAY)
        for what, want, have in (("hosts", asked.hosts, tb.hosts), ("rate", asked.rate, tb.rate),
                                 ("delay", asked.delay, tb.delay)):
            if getattr(args, what) is not None and want != have:
                raise UserError(f"a testbed with --{what} {have} is up, not {want}: `scaletrain testbed down` first, "
                                f"or leave --{what} out to run on it")
    # the hosts share this machine's cores: each is told (and pinned to) its share
    share = share_cores(sorted(os.sched_getaffinity(0)), tb.hosts, args.cores_per_host)
    if made:
        net.up(tb)
    print(share.describe(), flush=True)
    try:
        before = net.tx_bytes(tb)
        code = run_on_hosts(tb, command, share)
        after = net.tx_bytes(tb)
        sent = ", ".join(f"{h} {after[h] - before[h]:,}" for h in after)
        print(f"bytes sent on the testbed links during the command (interface counters): {sent}", flush=True)
    finally:
        if made:
            net.down()  # made for this command: removed on success, failure and Ctrl-C alike
    return code


COMMANDS = (
    Command("testbed", "a virtual cluster: hosts as network namespaces, shaped links",
            add_testbed_args, run_testbed),
)
