"""`scaletrain commbench`: arguments, one elastic launch per world size, the table and commbench.json."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from scaletrain.errors import UserError

DEFAULT_SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M"


def add_commbench_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Time each strategy's all-reduce from 1 KB to 64 MB and over world sizes: time, algorithm and "
                     "bus bandwidth (as nccl-tests defines them), bytes sent per rank, and the alpha-beta "
                     "model fitted to it (docs/commbench.md).")
    p.add_argument("--strategies", default="allreduce,ring",
                   help="comma list of allreduce, ring, ps (one parameter server, the last rank; default: allreduce,ring)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"message sizes (default: {DEFAULT_SIZES})")
    p.add_argument("--nproc", default=None, help="comma list of processes per node (default: 2..cores, at least 2)")
    p.add_argument("--seconds", type=float, default=0.3, help="time spent on each measurement (default: 0.3)")
    p.add_argument("--out", default=None, help="directory for commbench.json (default: runs/commbench-<time>)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes (run the same command on each; see testbed)")
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=None)
    p.add_argument("--local-addr", default=None)


def run_commbench(args: argparse.Namespace) -> int:
    from scaletrain.commbench.model import parse_size

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    bad = [s for s in strategies if s not in ("allreduce", "ring", "ps")]
    if bad or not strategies:
        raise UserError(f"--strategies: unknown {', '.join(bad) or '(none)'}: use allreduce, ring, ps")
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",")]
        procs = ([int(n) for n in args.nproc.split(",")] if args.nproc
                 else list(range(2, max(2, os.cpu_count() or 2) + 1)))
    except ValueError:
        raise UserError("--sizes takes sizes like 1K,64M and --nproc numbers like 2,3,4") from None
    if min(procs) < 1 or args.nnodes * min(procs) < 2:
        raise UserError("a collective needs at least 2 ranks: --nproc 2 or more (or --nnodes 2)")
    if args.nnodes > 1 and (len(procs) > 1 or args.master_port is None):
        raise UserError("several nodes: give one --nproc per node and --master-port (the same on every node)")
    out = Path(args.out or f"runs/commbench-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
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

    from scaletrain.commbench.measure import worker_main
    from scaletrain.launch import describe_failure, free_port, launch_config, quiet_agent_logs

    quiet_agent_logs()
    port = args.master_port or free_port(args.master_addr)
    cfg = launch_config(nproc, args.nnodes, args.node_rank, args.master_addr, port, args.local_addr)
    print(f"measuring {', '.join(strategies)} on {nproc * args.nnodes} ranks ...", flush=True)
    try:
        elastic_launch(cfg, worker_main)(strategies, sizes, args.seconds, str(rows_path))
    except ChildFailedError as e:
        raise UserError(f"commbench: {describe_failure(e)}") from None


def _report(rows_path: Path, out: Path) -> int:
    from rich.console import Console

    from scaletrain.commbench.model import with_model
    from scaletrain.commbench.view import fits_line, table
    from scaletrain.rundir import write_json_atomic

    rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
    rows, fits = with_model(rows)
    write_json_atomic(out / "commbench.json", {"rows": rows, "fits": fits})
    console = Console(highlight=False)
    console.print(table(rows))
    for strategy, fit in fits.items():
        console.print(fits_line(strategy, fit))
    console.print(f"results: {out / 'commbench.json'}")
    return 0
