"""`scaletrain commbench`: arguments, one elastic launch per world size, the table and commbench.json."""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

from scaletrain.command import Command
from scaletrain.errors import UserError

DEFAULT_SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M"
STRATEGIES = ("allreduce", "ring", "ps", "halo", "fp16", "bf16")
RANK_BYTES = 200 << 20
"""Memory of one rank before its buffers: Python, torch and gloo loaded (about 230 MiB resident here)."""
RANKS_PER_CORE = 8
"""More ranks than this on a core wait on the scheduler more than on each other: their times say nothing of
the network (docs/commbench.md)."""


def add_commbench_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Time each strategy's all-reduce from 1 KB to 64 MB and over world sizes: time, algorithm and "
                     "bus bandwidth (as nccl-tests defines them), bytes sent per rank, and the alpha-beta "
                     "model fitted to it (docs/commbench.md).")
    p.add_argument("--strategies", default="allreduce,ring",
                   help="comma list of allreduce, ring, ps (one parameter server, the last rank), halo (neighbours "
                        "swap, computing between swaps), fp16, bf16 (the all-reduce of --compress fp16|bf16 as its "
                        "hook runs it: cast, all-reduce, cast back; default: allreduce,ring)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma list of message sizes, each once, at least 4 bytes "
                                                          f"(default: {DEFAULT_SIZES})")
    p.add_argument("--nproc", default=None, help="comma list of processes per node (default: 2..cores, at least 2)")
    p.add_argument("--seconds", type=float, default=0.3,
                   help="time spent on each measurement, more than 0 (default: 0.3)")
    p.add_argument("--out", default=None, help="directory for commbench.json (default: runs/commbench-<time>)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes (run the same command on each; see testbed)")
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=None)
    p.add_argument("--local-addr", default=None)


def _comma_list(flag: str, text: str, parse, example: str, noun: str, unit: str = "") -> list:
    """A comma list, each item parsed; an empty item, a bad one or a duplicate is one line naming it."""
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise UserError(f"{flag} {text!r} has an empty item: give a comma list such as {flag} {example}")
    values = []
    for item in items:
        try:
            value = parse(item)
        except (ValueError, OverflowError):
            raise UserError(f"{flag} {text}: {item!r} is not {noun}: give a comma list such as {flag} {example}") \
                from None
        if value in values:
            first = items[values.index(value)]
            same = f"{item!r} twice" if first == item else f"{first!r} and {item!r}, both {value}{unit}"
            raise UserError(f"{flag} {text} lists {same}: give each once")
        values.append(value)
    return values


def _message_bytes(item: str) -> int:
    from scaletrain.units import parse_size

    size = parse_size(item)
    size -= size % 4  # whole float32 elements
    if size < 4:  # the buffer holds float32 elements
        raise UserError(f"--sizes: {item!r} is less than 4 bytes: a message holds whole float32 elements "
                        "(4 bytes each); give sizes such as 4,1K,64M")
    return size


def check_request(args: argparse.Namespace) -> tuple[list[str], list[int], list[int]]:
    """(strategies, sizes in bytes, processes per node) from the flags; every impossible value is a UserError.

    Nothing is created or launched before this has passed."""
    strategies = _comma_list("--strategies", args.strategies, str, "allreduce,ring", "a strategy")
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad:
        raise UserError(f"--strategies: unknown {', '.join(bad)}: use {', '.join(STRATEGIES)}")
    sizes = _comma_list("--sizes", args.sizes, _message_bytes, "1K,64M", "a size",
                        unit=" bytes (sizes round down to whole 4-byte float32 elements)")
    if args.nproc:
        procs = _comma_list("--nproc", args.nproc, int, "2,4", "a whole number")
    else:
        procs = list(range(2, max(2, os.cpu_count() or 2) + 1))
    if args.nnodes < 1:
        raise UserError(f"--nnodes {args.nnodes}: give at least 1")
    if not 0 <= args.node_rank < args.nnodes:
        places = "the only node is 0" if args.nnodes == 1 else f"nodes are 0 to {args.nnodes - 1}"
        raise UserError(f"--node-rank {args.node_rank}: with --nnodes {args.nnodes} {places}")
    if min(procs) < 1 or args.nnodes * min(procs) < 2:
        raise UserError("a collective needs at least 2 ranks: --nproc 2 or more (or --nnodes 2)")
    if args.nnodes > 1 and (len(procs) > 1 or args.master_port is None):
        raise UserError("several nodes: give one --nproc per node and --master-port (the same on every node)")
    if not (args.seconds > 0 and math.isfinite(args.seconds)):
        raise UserError(f"--seconds {args.seconds}: give the time per measurement in seconds, more than 0 "
                        "(e.g. --seconds 0.3)")
    if args.master_port is not None and not 1 <= args.master_port <= 65535:
        raise UserError(f"--master-port {args.master_port}: give a port from 1 to 65535 (or leave it out)")
    memory = _memory_bytes()
    if memory and max(sizes) > memory:
        raise UserError(f"--sizes: {max(sizes)} bytes is more than this machine's memory ({memory} bytes): "
                        "give smaller sizes")
    _check_ranks(max(procs), max(sizes), args.nnodes, "ps" in strategies)
    return strategies, sizes, procs


def _check_ranks(nproc: int, size: int, nnodes: int, ps: bool) -> None:
    """Refuse more ranks on this node than its cores and memory hold, before any is started: each rank holds
    its message and a copy; a parameter server two of every worker's."""
    from scaletrain.distributed.device import machine_cores
    from scaletrain import fmt
    from scaletrain.perf.footprint import available_bytes

    cores, available = machine_cores(), available_bytes("cpu")
    per_rank = RANK_BYTES + 2 * size * (1 + (nnodes if ps else 0))
    most = RANKS_PER_CORE * cores if available is None else min(RANKS_PER_CORE * cores, available // per_rank)
    if nproc > most:
        memory = "" if available is None else (f", {fmt.size(available)} of memory available and at least "
                                               f"{fmt.size(per_rank)} a rank")
        fix = f"give --nproc {most} or fewer" if most >= 2 else "give smaller --sizes"
        raise UserError(f"--nproc {nproc} is more ranks than this machine holds ({cores} cores, at most "
                        f"{RANKS_PER_CORE} ranks a core{memory}): {fix}")


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _out_dir(args: argparse.Namespace) -> Path:
    from scaletrain.rundir import check_out

    out = Path(args.out or f"runs/commbench-{time.strftime('%Y%m%d-%H%M%S')}")
    check_out(out, "commbench result")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out {out}: cannot create it ({e.strerror}): choose another --out") from None
    return out


def run_commbench(args: argparse.Namespace) -> int:
    strategies, sizes, procs = check_request(args)
    out = _out_dir(args)
    rows_path = out / "rows.jsonl"
    rows_path.unlink(missing_ok=True) if args.node_rank == 0 else None
    for nproc in procs:
        _launch(args, nproc, strategies, sizes, rows_path)
    if args.node_rank != 0:
        return 0
    return _report(rows_path, out)


def _launch(args, nproc: int, strategies: list[str], sizes: list[int], rows_path: Path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from scaletrain.distributed import failure
    from scaletrain.commbench.measure import worker_main
    from scaletrain.distributed.launch.local import launch_config, quiet_agent_logs
    from scaletrain.distributed.launch.preflight import free_port

    quiet_agent_logs()
    port = args.master_port or free_port(args.master_addr)
    cfg = launch_config(nproc, args.nnodes, args.node_rank, args.master_addr, port, args.local_addr)
    print(f"measuring {', '.join(strategies)} on {nproc * args.nnodes} ranks ...", flush=True)
    try:
        elastic_launch(cfg, worker_main)(strategies, sizes, args.seconds, str(rows_path))
    except ChildFailedError as e:  # the workers record no error file: the exit codes (or signals) say it
        exitcodes = {rank: f.exitcode for rank, f in e.failures.items()}
        message, _ = failure.explain(failure.Outcome(records=[], exitcodes=exitcodes, hung_s={}, timeout_s=0.0),
                                     lambda rank: f"rank {rank}")
        raise UserError(f"commbench: {message}") from None


def _report(rows_path: Path, out: Path) -> int:
    from scaletrain.console.width import output_console
    from scaletrain.commbench.view import fits_line, table
    from scaletrain.grid import rich_table
    from scaletrain.perf.alphabeta import with_model
    from scaletrain.rundir import COMMBENCH, write_json_atomic

    rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
    rows, fits = with_model(rows)
    write_json_atomic(out / COMMBENCH, {"rows": rows, "fits": fits})
    console = output_console(highlight=False)
    console.print(rich_table(table(rows)))
    for strategy, fit in fits.items():
        console.print(fits_line(strategy, fit))
    console.print(f"results: {out / COMMBENCH}")
    return 0


COMMANDS = (
    Command("commbench", "time all-reduce strategies over sizes and ranks, against the alpha-beta model",
            add_commbench_args, run_commbench),
)
