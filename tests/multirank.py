"""Several ranks on this machine without a launcher: a function run in N spawned processes that meet in gloo.

    results = ranks.run(fn, world, *args)     # fn(rank, world, *args) in each of `world` processes, by rank

The processes are started on first need and kept for the test session (torch is imported once: a call
costs its work, not 3 s of start-up per rank); each runs one torch thread unless the job sets its own (the
trainer does, from its config, as a launched worker would). Each call gets a fresh rendezvous in the
children's environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE: env://), which `fn` joins with `group()`
or through scaletrain's own code (distributed/group.init_process_group, comm/ps/links.join). A rank that raises fails
the test with its traceback; a rank that dies, or a call that outlives its timeout (the hung ranks' Python
stacks go to stderr), fails it too, so a hang never hangs CI. After any failure the processes are replaced.

`train(ranks, *ARGV)` runs `scaletrain train ARGV` this way: the CLI's checks and run directory, then
train/worker.run on each rank, without the elastic agent.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(index: int, inbox, outbox, environ: dict) -> None:
    """A pool process: run each job sent to it, report its result or traceback, clean up after it."""
    os.environ.clear()  # the session's environment, not that of the test that happened to start this process
    os.environ.update(environ)
    import torch
    import torch.distributed as dist

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks for the stacks of a hung rank
    torch.set_num_threads(1)
    _pause_before_destroying_groups()
    while True:
        job = inbox.get()
        if job is None:
            return
        fn, world, port, args = job
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(index), WORLD_SIZE=str(world),
                          LOCAL_RANK=str(index), LOCAL_WORLD_SIZE=str(world))
        try:
            # pickled here, by value (tensors too, no shared memory): what cannot go back is an error here,
            # not a silent hang in the parent
            reply = (index, "ok", pickle.dumps(fn(index, world, *args)))
        except BaseException:  # SystemExit too (worker_main exits): the parent reports it
            reply = (index, "error", traceback.format_exc())
        finally:
            for var in RENDEZVOUS:
                os.environ.pop(var, None)
            if dist.is_initialized():  # a group the function left behind must not leak into the next job
                dist.destroy_process_group()
            gc.collect()  # nor its DDP modules and their groups, freed in the middle of the next job
            torch.set_num_threads(1)  # the trainer sets it from its config
        outbox.put(reply)


def _pause_before_destroying_groups() -> None:
    """Give gloo's threads the GIL for a moment before a process group goes (torch 2.13 deadlock, below).

    A gloo worker thread frees each finished collective, and with it the tensors it held; a tensor that ever
    had a Python object needs the GIL to go. ProcessGroupGloo's destructor joins those threads while its
    caller holds the GIL. So a group destroyed (by destroy_process_group, or by freeing the DDP module that
    holds the last reference to it) within moments of its last collective can deadlock: seen here about once
    in 30 runs, in the trainer's teardown right after its final barrier (gdb: the main thread in
    ~ProcessGroupGloo -> thread::join, a pt_gloo_runloop thread in ~AsyncBarrierWork -> take_gil). A pool
    process runs on after the job, so the rare hang would stall the suite; this pause in the pool's processes
    (not in scaletrain) lets those threads finish first."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    destroy = distributed_c10d.destroy_process_group

    def destroy_after_a_pause(group=None):
        time.sleep(0.05)  # the GIL released: a gloo thread that waits for it gets it
        return destroy(group)

    dist.destroy_process_group = distributed_c10d.destroy_process_group = destroy_after_a_pause


class Ranks:
    """Processes that run one function at a time, each as one rank; started on first need, kept for reuse."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")  # fork would copy the test runner's threads and torch state
        self.environ = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
        self.outbox = self.ctx.Queue()
        self.procs: list = []
        self.inboxes: list = []

    def ensure(self, world: int) -> None:
        """At least `world` live processes (all replaced if one has died)."""
        if not all(p.is_alive() for p in self.procs):
            self.close()
        while len(self.procs) < world:
            i = len(self.procs)
            inbox = self.ctx.Queue()
            proc = self.ctx.Process(target=_serve, args=(i, inbox, self.outbox, self.environ), daemon=True,
                                    name=f"rank{i}")
            proc.start()
            self.procs.append(proc)
            self.inboxes.append(inbox)

    def close(self) -> None:
        """Stop the processes (they hold nothing worth a polite exit)."""
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.join(timeout=10)
        self.procs, self.inboxes = [], []
        self.outbox = self.ctx.Queue()  # replies of a failed call must not reach the next one

    def run(self, fn: Callable, world: int, *args: Any, timeout: float = 120) -> list:
        """fn(rank, world, *args) on ranks 0..world-1; their return values by rank. `fn` and `args` must pickle
        (a module-level function of a test module)."""
        import pytest

        self.ensure(world)
        port = free_port()
        for i in range(world):
            self.inboxes[i].put((fn, world, port, args))
        results: list = [None] * world
        pending = set(range(world))
        deadline = time.monotonic() + timeout
        while pending:
            try:
                index, status, value = self.outbox.get(timeout=0.5)
            except queue.Empty:
                index, status, value = None, "waiting", None
            if status == "waiting":
                dead = [i for i in sorted(pending) if not self.procs[i].is_alive()]
                if dead or time.monotonic() > deadline:
                    why = (f"rank {dead[0]} died (exit code {self.procs[dead[0]].exitcode})" if dead else
                           f"ranks {sorted(pending)} did not finish within {timeout:g} s (their stacks: stderr)")
                    for i in [] if dead else pending:
                        os.kill(self.procs[i].pid, signal.SIGUSR1)
                    time.sleep(0 if dead else 1)
                    self.close()
                    pytest.fail(f"{fn.__name__} on {world} ranks: {why}", pytrace=False)
                continue
            if status == "error":
                self.close()  # the other ranks may wait for it in a collective: replace them all
                pytest.fail(f"rank {index} of {world} raised in {fn.__name__}:\n{value}", pytrace=False)
            results[index] = pickle.loads(value)
            pending.discard(index)
        return results


@contextlib.contextmanager
def group(timeout_s: float = 60):
    """The default gloo process group over this call's ranks (from the environment `Ranks.run` set)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timedelta(seconds=timeout_s))
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------ the trainer on the pool's ranks

def train_config(*argv: str):
    """The TrainConfig `scaletrain train ARGV` would run (no progress bar; threads per rank as the CLI's)."""
    from scaletrain.cli import build_parser
    from scaletrain.train.cli import train_config as from_args

    return from_args(build_parser().parse_args(["train", "--no-progress", *argv]))


def prepare(*argv: str):
    """What `scaletrain train ARGV` does before it starts the ranks: its checks, then the run directory and
    its config.toml. Returns the config the ranks run."""
    from scaletrain.config import save_toml
    from scaletrain.distributed.launch.preflight import preflight
    from scaletrain.rundir import create

    cfg = train_config(*argv)
    run, cfg = preflight(cfg)
    create(run)
    save_toml(cfg, run.config)
    return cfg


def train(ranks: Ranks, *argv: str, timeout: float = 120) -> dict | None:
    """`scaletrain train ARGV` with the pool's processes as its ranks instead of the elastic agent's: the same
    checks, the same run directory (config.toml, metrics, checkpoint, summary.json); rank 0's summary."""
    cfg = prepare(*argv)
    return ranks.run(train_rank, cfg.launch.nproc * cfg.launch.nnodes, cfg.to_dict(), timeout=timeout)[0]


def train_rank(rank: int, world: int, cfg_dict: dict) -> dict | None:
    """One rank of a run, as the elastic agent's worker runs it (train/worker.run)."""
    from scaletrain.config import config_from_dict
    from scaletrain.distributed.rank import RankInfo
    from scaletrain.train.worker import run

    return run(config_from_dict(cfg_dict), RankInfo(rank, rank, world, world))
