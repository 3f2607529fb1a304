"""The workers of this node through torch's elastic agent (the engine's launcher, not a process pool)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
import uuid

from scaletrain.comm.registry import strategy_class
from scaletrain.config import TrainConfig
from scaletrain.distributed import failure
from scaletrain.distributed.allocator import rank_environment
from scaletrain.distributed.launch import spawned
from scaletrain.distributed.launch.outcome import print_resume_hint, print_summary, rank_namer
from scaletrain.errors import UserError
from scaletrain.rundir import RunDir, read_summary
from scaletrain.train import restarts, summary


def launch_local(cfg: TrainConfig, run: RunDir, port: int) -> int:
    """nproc workers through the elastic agent behind torchrun (the engine's launcher, not a process pool)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from scaletrain.train.worker import worker_main

    quiet_agent_logs()
    launch = cfg.launch
    launch_cfg = launch_config(launch.nproc, launch.nnodes, launch.node_rank, launch.master_addr, port,
                               launch.local_addr, cfg.faults.timeout, cfg.faults.max_restarts)
    if launch.nnodes > 1 and not os.environ.get("SCALETRAIN_ISOLATED_AGENT"):  # (one machine's agents: no nodes)
        print(f"node {launch.node_rank} of {launch.nnodes}: waiting up to {cfg.faults.timeout:g} s (--timeout) for "
              f"the other nodes at {launch.master_addr}:{port}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="scaletrain-err-") as err_dir:
        watchdog = failure.Watchdog(err_dir)
        try:
            with no_exit_barrier(strategy_class(cfg.strategy.name).tolerates_dead_workers), \
                    recording_restarts(err_dir, run, cfg), preemption_requests(run), \
                    spawned.errors_to(err_dir, **rank_environment(cfg.launch.allocator)):
                elastic_launch(launch_cfg, worker_main)(cfg.to_dict(), err_dir)
        except ChildFailedError as e:
            exitcodes = {rank: f.exitcode for rank, f in e.failures.items()}
            message, bad_input = failure.explain(failure.read_outcome(err_dir, exitcodes, cfg.faults.timeout),
                                                 rank_namer(cfg))
            if cfg.launch.node_rank == 0:
                summary.failed(run, cfg, message)
            print(f"error: {message}", file=sys.stderr)
            if not bad_input:  # bad input is fixed first; the hint would repeat a refused command
                print_resume_hint(run, cfg)
            return 2 if bad_input else 1
        except (KeyboardInterrupt, SignalException) as e:
            signum = getattr(e, "sigval", signal.SIGINT)
            if cfg.launch.node_rank == 0:
                summary.failed(run, cfg, f"interrupted ({signal.Signals(signum).name})")
            print(f"interrupted by {signal.Signals(signum).name}", file=sys.stderr)
            print_resume_hint(run, cfg)
            return 128 + int(signum)
        except Exception as e:  # the rendezvous: a node that never comes, an unreachable node 0
            if not _is_rendezvous_failure(e):
                raise
            raise UserError(f"the nodes did not meet at {cfg.launch.master_addr}:{port} within --timeout "
                            f"{cfg.faults.timeout:g} s ({type(e).__name__}): start node 0 (--node-rank 0) too, with "
                            f"--nnodes {cfg.launch.nnodes} and the same --master-port on every node, and check that "
                            f"this node reaches {cfg.launch.master_addr}:{port} (firewall, address)") from None
        finally:
            watchdog.stop()
    status = (read_summary(run.root, strict=False) or {}).get("status")
    if cfg.launch.node_rank == 0:
        print_summary(run, cfg)
        if status in ("stopped", "preempted"):
            print_resume_hint(run, cfg, stopped=status)
    return PREEMPTED if status == "preempted" else 0


PREEMPTED = 75  # EX_TEMPFAIL: checkpointed on a preemption request; run it again with --resume (or requeue)


def _is_rendezvous_failure(e: Exception) -> bool:
    """The agent's own failures to meet: the rendezvous, its store (DistError and its kinds), timeouts."""
    import torch.distributed as dist

    names = " ".join(t.__name__.lower() for t in type(e).__mro__)
    return isinstance(e, dist.DistError) or any(word in names for word in ("rendezvous", "timeout"))


def launch_config(nproc: int, nnodes: int, node_rank: int, master_addr: str, port: int,
                  local_addr: str | None = None, timeout_s: float = 180.0, max_restarts: int = 0):
    """The elastic agent's settings: c10d rendezvous on one node; static node ranks across several."""
    from torch.distributed.launcher.api import LaunchConfig

    common = dict(nproc_per_node=nproc, max_restarts=max_restarts, monitor_interval=0.1, start_method="spawn",
                  rdzv_endpoint=f"{master_addr}:{port}")
    if nnodes == 1:
        return LaunchConfig(min_nodes=1, max_nodes=1, run_id=f"scaletrain-{uuid.uuid4().hex[:8]}",
                            rdzv_backend="c10d", rdzv_configs={"join_timeout": timeout_s}, **common)
    return LaunchConfig(min_nodes=nnodes, max_nodes=nnodes, run_id="scaletrain", rdzv_backend="static",
                        rdzv_configs={"rank": node_rank, "timeout": timeout_s}, local_addr=local_addr, **common)


@contextlib.contextmanager
def no_exit_barrier(active: bool):
    """A strategy that tolerates dead workers (ps-async) goes on when a worker dies, but the elastic agent of each node waits up to 300 s at exit
    for every other node's agent, and a dead worker's agent never comes. Worker 0 leaves last anyway (it
    waits, through the servers, until every worker has finished), so in that case the wait is skipped.
    LaunchConfig does not expose the timeout; this replaces the agent's barrier method while it runs."""
    if not active:
        yield
        return
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    original = SimpleElasticAgent._exit_barrier
    SimpleElasticAgent._exit_barrier = lambda self: None
    try:
        yield
    finally:
        SimpleElasticAgent._exit_barrier = original


@contextlib.contextmanager
def recording_restarts(err_dir: str, run: RunDir, cfg: TrainConfig):
    """Each failure the agent is about to restart the workers from goes on record in RUN/restarts.jsonl
    (why, which rank, the step reached), and the failed attempt's error records are set aside so that the
    next attempt's explanation is its own. A failure that is bad input is not restarted: it would only
    fail again. The agent offers no hook for this; its monitor method is wrapped while it runs."""
    if cfg.faults.max_restarts == 0:
        yield
        return
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    original = LocalElasticAgent._monitor_workers

    def monitor(self, group):
        result = original(self, group)
        if result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY) and self._remaining_restarts > 0:
            exitcodes = {rank: f.exitcode for rank, f in result.failures.items()}
            outcome = failure.read_outcome(err_dir, exitcodes, cfg.faults.timeout)
            cause, bad_input = failure.explain(outcome, rank_namer(cfg))
            if bad_input:
                self._remaining_restarts = 0
                return result
            first = min(exitcodes, key=lambda r: (exitcodes[r] >= 0, r)) if exitcodes else None
            attempt = cfg.faults.max_restarts - self._remaining_restarts
            restarts.append(run, {"event": "failure", "attempt": attempt, "time": time.time(),
                                  "node": cfg.launch.node_rank, "rank": first, "cause": cause,
                                  "reached_step": restarts.reached_step(run)})
            failure.set_aside(err_dir, attempt)
            print(f"restarting the workers ({attempt + 1} of --max-restarts {cfg.faults.max_restarts}) after: {cause}",
                  file=sys.stderr, flush=True)
        return result

    LocalElasticAgent._monitor_workers = monitor
    try:
        yield
    finally:
        LocalElasticAgent._monitor_workers = original


@contextlib.contextmanager
def preemption_requests(run: RunDir):
    """SIGUSR1 to this launcher (SLURM's warning before a time limit or a preemption) becomes RUN/preempt:
    the workers checkpoint within 10 steps and end; the launch exits with PREEMPTED."""
    def request(signum, frame) -> None:
        try:
            run.preempt.touch()
        except OSError:
            pass

    previous = signal.signal(signal.SIGUSR1, request)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


def quiet_agent_logs() -> None:
    """The agent logs every worker exit and signal at WARNING/ERROR; callers report them in one line.
    Its loggers set their own levels when created, so each one is quietened, not just the parent."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.multiprocessing")):
            logging.getLogger(name).setLevel(logging.CRITICAL)
