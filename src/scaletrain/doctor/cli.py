"""`scaletrain doctor`: the pre-flight of a multi-node launch, started once per node with train's node
flags; node 0 prints a table of checks with a fix for each failure (docs/doctor.md)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from scaletrain.command import Command
from scaletrain.distributed.rank import slurm_node_flags
from scaletrain.errors import UserError
from scaletrain.units import parse_rate


def add_doctor_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Pre-flight checks of a multi-node launch: run it on every node with the node flags of "
                     "`scaletrain train` (or through `scaletrain testbed run`); the nodes meet at node 0, which "
                     "prints a table of checks with the fix for each failure. Exit 1 when a check fails "
                     "(docs/doctor.md).")
    nodes = p.add_argument_group("nodes (as for scaletrain train)")
    nodes.add_argument("--nnodes", type=int, default=None, help="nodes taking part (default: 1; in a task of "
                                                                "`srun --ntasks-per-node=1`: the allocation's nodes)")
    nodes.add_argument("--node-rank", type=int, default=None, help="this node's index, 0..nnodes-1 (node 0 hosts the "
                                                                   "meeting and prints the table; under srun: "
                                                                   "SLURM_NODEID)")
    nodes.add_argument("--master-addr", default=None, help="node 0's address (default: 127.0.0.1; under srun: the "
                                                           "allocation's first host)")
    nodes.add_argument("--master-port", type=int, default=None, help="the rendezvous port train will use "
                                                                     "(needed with --nnodes > 1)")
    nodes.add_argument("--local-addr", default=None, help="this node's address as the others reach it "
                                                          "(default: the one the route to node 0 leaves from)")
    nodes.add_argument("--timeout", type=float, default=20.0, help="seconds node 0 waits for the other nodes "
                                                                   "(default: 20)")
    nodes.add_argument("--out", default="runs", help="the run directory to check: shared and writable from every "
                                                     "node, free space (default: runs)")
    nodes.add_argument("--probe-port", type=int, default=None,
                       help="a second port node 0 listens on, to tell a blocked rendezvous port from an unreachable "
                            "node (default: --master-port + 1; 0: none)")
    expect = p.add_argument_group("what to expect")
    expect.add_argument("--link-rate", default=None, help="the declared link rate in bits per second (1gbit, 100mbit, "
                                                          "10gbit); default: pairs are compared with the fastest pair")
    expect.add_argument("--min-link-fraction", type=float, default=0.3,
                        help="a pair fails below this fraction of --link-rate (default: 0.3)")
    expect.add_argument("--clock-tolerance", type=float, default=1.0,
                        help="seconds a node's clock may differ from node 0's (default: 1)")
    expect.add_argument("--min-free-gb", type=float, default=1.0,
                        help="free space --out's file system needs on every node, GB (default: 1)")
    expect.add_argument("--gpus-per-node", type=int, default=0,
                        help="GPUs every node must see, with NCCL in torch (default: 0, none expected)")
    p.add_argument("--json", default=None, metavar="FILE", help="node 0 also writes the results here as JSON")


def check_args(args: argparse.Namespace):
    """(this node's flags, the expectations) from the arguments; every bad value is one line (exit 2)."""
    from scaletrain.config.sections import LaunchConfig
    from scaletrain.distributed.launch.preflight import check_address, free_port
    from scaletrain.doctor.gathered import Expect
    from scaletrain.doctor.session import Node

    from_slurm = slurm_node_flags() if args.nnodes is None else None
    for key, default in (("nnodes", 1), ("node_rank", 0), ("master_addr", "127.0.0.1"), ("master_port", None)):
        if getattr(args, key) is None:  # inside an allocation, every node's task finds the same flags
            setattr(args, key, (from_slurm or {}).get(key, default))
    # the node flags mean what they mean for train, and are refused with train's words
    LaunchConfig(nnodes=args.nnodes, node_rank=args.node_rank, master_addr=args.master_addr,
                 master_port=args.master_port, local_addr=args.local_addr)
    check_address("--master-addr", args.master_addr)  # one line now, not a row of the table after the meeting
    if args.local_addr:
        check_address("--local-addr", args.local_addr)
    if not 0 < args.timeout < math.inf:
        raise UserError(f"--timeout must be a positive number of seconds (got {args.timeout}): e.g. 20")
    port = args.master_port if args.master_port is not None else free_port(args.master_addr)
    probe = args.probe_port if args.probe_port is not None else (port + 1 if port < 65535 and args.nnodes > 1 else 0)
    if probe and not 1 <= probe <= 65535 or probe == port:
        raise UserError(f"--probe-port must be in 1..65535 and not --master-port ({port}), or 0 for none "
                        f"(got {args.probe_port})")
    if not 0 < args.min_link_fraction <= 1:
        raise UserError(f"--min-link-fraction must be in (0, 1] (got {args.min_link_fraction}): e.g. 0.3")
    if not 0 < args.clock_tolerance < math.inf:
        raise UserError(f"--clock-tolerance must be a positive number of seconds (got {args.clock_tolerance})")
    if not 0 <= args.min_free_gb < math.inf:
        raise UserError(f"--min-free-gb must be 0 or more (got {args.min_free_gb})")
    if args.gpus_per_node < 0:
        raise UserError(f"--gpus-per-node must be 0 (none expected) or more (got {args.gpus_per_node})")
    if args.json and args.node_rank == 0 and not Path(args.json).absolute().parent.is_dir():
        raise UserError(f"--json {args.json}: the folder {Path(args.json).parent} does not exist: create it first")
    rate = parse_rate(args.link_rate, "--link-rate") if args.link_rate else None
    node = Node(nnodes=args.nnodes, rank=args.node_rank, master_addr=args.master_addr, master_port=port,
                probe_port=probe or None, local_addr=args.local_addr, timeout_s=args.timeout, out=args.out)
    expect = Expect(link_rate=args.link_rate, link_bytes_per_s=rate, min_link_fraction=args.min_link_fraction,
                    clock_tolerance_s=args.clock_tolerance, min_free_bytes=int(args.min_free_gb * 1e9),
                    gpus_per_node=args.gpus_per_node)
    return node, expect


def run_doctor(args: argparse.Namespace) -> int:
    from scaletrain.distributed import hostfacts

    node, expect = check_args(args)
    start = time.monotonic()
    facts = hostfacts.gather(node.rank, node.nnodes, node.master_addr, node.master_port, node.local_addr)
    if node.rank == 0:
        return _node0(node, expect, facts, args.json, start)
    return _other(node, facts)


def _node0(node, expect, facts, json_path: str | None, start: float) -> int:
    from scaletrain.console.width import output_console
    from scaletrain.doctor import session
    from scaletrain.doctor.checks import evaluate, exit_code
    from scaletrain.doctor.table import document, summary_line, table, verdict, write_json
    from scaletrain.grid import rich_table

    g, boards = session.run_node0(node, facts)
    checks = evaluate(g, expect)
    seconds = time.monotonic() - start
    console = output_console(highlight=False)
    console.print(rich_table(table(g, checks, seconds)))
    console.print(f"doctor: {summary_line(checks)}")
    if json_path:
        write_json(json_path, document(g, checks, expect, seconds))
    session.tell(boards, verdict(checks), g)
    return exit_code(checks)


def _other(node, facts) -> int:
    from scaletrain.doctor import session
    from scaletrain.doctor.table import node_line

    label = facts.label()
    try:
        v, problem = session.run_other(node, facts)
    except (RuntimeError, TimeoutError) as e:  # node 0's store went away, or never answered
        print(f"doctor: {label}: lost node 0 at {node.master_addr}:{node.master_port} before its verdict "
              f"({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}): see node 0's output",
              file=sys.stderr)
        return 1
    if v is None:  # nothing reached: `testbed run` stops every host when one fails, so let node 0 finish first
        linger = min(session.LINGER_S, node.timeout_s)
        print(f"doctor: {label}: {problem}; exiting in {linger:g} s (so that node 0, if it runs, prints its table "
              "first)", file=sys.stderr, flush=True)
        time.sleep(linger)
        return 1
    if problem:
        print(f"doctor: {label}: {problem}", file=sys.stderr)
    print(node_line(label, v), flush=True)
    return max(v["code"], 1 if problem else 0)


COMMANDS = (
    Command("doctor", "pre-flight checks of a multi-node launch: hosts, ports, versions, "
            "clocks, shared run directory, links",
            add_doctor_args, run_doctor),
)
