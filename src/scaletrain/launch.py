"""`scaletrain train`: check the request, prepare the run directory, start workers via torch's elastic agent."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
import traceback
import uuid
from pathlib import Path

from scaletrain import checkpoint
from scaletrain.config import TrainConfig, save_toml
from scaletrain.data import build_datasets
from scaletrain.dist import RankInfo, check_device_request, launched_externally, slurm_rendezvous
from scaletrain.errors import UserError
from scaletrain.models import build_model
from scaletrain.rundir import RunDir, check_out_dir, create, keep_epochs_before, read_jsonl, write_json_atomic


def preflight(cfg: TrainConfig) -> RunDir:
    """Every check that can be made before a worker starts; writes nothing."""
    cfg.check_launch()
    # the run directory is node 0's to check and create (other nodes of a shared file system join it)
    run = check_out_dir(cfg.out, cfg.resume) if cfg.node_rank == 0 else RunDir(Path(cfg.out))
    check_device_request(cfg.device, cfg.nproc, cfg.precision)
    data = build_datasets(cfg.dataset, image_size=cfg.image_size, seed=cfg.seed,
                          synthetic_samples=cfg.synthetic_samples, synthetic_classes=cfg.synthetic_classes,
                          augment=False)
    build_model(cfg.model, num_classes=data.num_classes, in_channels=data.in_channels,
                image_size=data.image_size, stem=cfg.stem, width=cfg.width)
    if cfg.resume:
        ckpt = checkpoint.load(run.checkpoint, mmap=True)
        checkpoint.check_compatible(ckpt, cfg.model, cfg.dataset, run.checkpoint)
    return run


def free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def check_port(addr: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, port))
        except OSError:
            raise UserError(f"master port {port} on {addr} is already in use (another job?): pass a free "
                            "--master-port, or leave it out to pick one automatically") from None


# set in the agents that an isolated launch starts: the parent already checked and created the run
AGENT_OF_ISOLATED = "SCALETRAIN_ISOLATED_AGENT"


def train(cfg: TrainConfig) -> int:
    """Run a training job; returns the process exit code."""
    if launched_externally():
        return _join_external_launch(cfg)
    if os.environ.get(AGENT_OF_ISOLATED):
        return _launch_local(cfg, RunDir(Path(cfg.out)), cfg.master_port)
    run = preflight(cfg)
    if cfg.node_rank == 0:
        create(run)
        if not cfg.resume:  # a failed earlier attempt without a checkpoint: start its records afresh
            for path in [run.epochs, *run.root.glob("metrics-rank*.jsonl")]:
                keep_epochs_before(path, 0)
        save_toml(cfg, run.config)
    else:
        run.root.mkdir(parents=True, exist_ok=True)
    port = cfg.master_port
    if port is None:
        port = free_port(cfg.master_addr)
    elif cfg.node_rank == 0:
        check_port(cfg.master_addr, port)
    if cfg.strategy == "ps-async" and cfg.nnodes == 1 and cfg.nproc > 1:
        from scaletrain.isolated import launch_isolated
        return launch_isolated(cfg, run, port)
    return _launch_local(cfg, run, port)


def _launch_local(cfg: TrainConfig, run: RunDir, port: int) -> int:
    """nproc workers through the elastic agent behind torchrun (the engine's launcher, not a process pool)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from scaletrain.train import worker_main

    quiet_agent_logs()
    launch_cfg = launch_config(cfg.nproc, cfg.nnodes, cfg.node_rank, cfg.master_addr, port, cfg.local_addr)
    with tempfile.TemporaryDirectory(prefix="scaletrain-err-") as err_dir:
        try:
            with no_exit_barrier(cfg.strategy == "ps-async"):
                elastic_launch(launch_cfg, worker_main)(cfg.to_dict(), err_dir)
        except ChildFailedError as e:
            message = _worker_error(err_dir) or describe_failure(e)
            if cfg.node_rank == 0:
                _write_failed_summary(run, cfg, message)
            print(f"error: {message}", file=sys.stderr)
            return 2 if _worker_error(err_dir) else 1
        except (KeyboardInterrupt, SignalException):
            if cfg.node_rank == 0:
                _write_failed_summary(run, cfg, "interrupted")
            print(f"interrupted: continue with  scaletrain train --resume --out {run.root}", file=sys.stderr)
            return 130
        except Exception as e:  # the rendezvous: a node that never comes, an unreachable node 0
            if "rendezvous" not in type(e).__name__.lower() and "timeout" not in type(e).__name__.lower():
                raise
            where = f"{cfg.master_addr}:{port}"
            raise UserError(f"the nodes did not meet at {where} ({type(e).__name__}): check that every node "
                            f"runs with --nnodes {cfg.nnodes}, the same --master-port, and can reach "
                            f"{cfg.master_addr}") from None
    if cfg.node_rank == 0:
        _print_summary(run)
    return 0


def launch_config(nproc: int, nnodes: int, node_rank: int, master_addr: str, port: int,
                  local_addr: str | None = None):
    """The elastic agent's settings: c10d rendezvous on one node; static node ranks across several."""
    from torch.distributed.launcher.api import LaunchConfig

    common = dict(nproc_per_node=nproc, max_restarts=0, monitor_interval=0.1, start_method="spawn",
                  rdzv_endpoint=f"{master_addr}:{port}")
    if nnodes == 1:
        return LaunchConfig(min_nodes=1, max_nodes=1, run_id=f"scaletrain-{uuid.uuid4().hex[:8]}",
                            rdzv_backend="c10d", **common)
    return LaunchConfig(min_nodes=nnodes, max_nodes=nnodes, run_id="scaletrain", rdzv_backend="static",
                        rdzv_configs={"rank": node_rank, "timeout": 120}, local_addr=local_addr, **common)


@contextlib.contextmanager
def no_exit_barrier(active: bool):
    """ps-async goes on when a worker dies, but the elastic agent of each node waits up to 300 s at exit
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


def quiet_agent_logs() -> None:
    """The agent logs every worker exit and signal at WARNING/ERROR; callers report them in one line.
    Its loggers set their own levels when created, so each one is quietened, not just the parent."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def _join_external_launch(cfg: TrainConfig) -> int:
    """Under torchrun or srun, this process is one worker: join the job instead of launching one."""
    from scaletrain.train import run as run_worker

    code = 0
    try:
        os.environ.update(slurm_rendezvous(dict(os.environ)) if "RANK" not in os.environ else {})
        rank = RankInfo.from_env()
        run = preflight(cfg)
        if rank.is_main:
            create(run)
            save_toml(cfg, run.config)
        else:
            run.root.mkdir(parents=True, exist_ok=True)
        run_worker(cfg, rank)
        if rank.is_main:
            _print_summary(run)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except BaseException:  # a bug: keep its traceback, which os._exit below would otherwise swallow
        traceback.print_exc()
        code = 1
    finally:
        # Leave without C++ static destructors, as multiprocessing workers do: after set_num_threads and
        # a gloo process group, PyTorch 2.13 sometimes aborts in them ("terminate called without an
        # active exception", seen in about 1 of 8 torchrun launches here), failing a finished job.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _worker_error(err_dir: str) -> str | None:
    files = sorted(Path(err_dir).glob("rank*.txt"))
    return files[0].read_text().strip() if files else None


def describe_failure(e) -> str:
    rank, failure = e.get_first_failure()
    detail = failure.message if isinstance(failure.message, str) else failure.message.get("message", "")
    last = detail.strip().splitlines()[-1] if detail and detail.strip() else f"exit code {failure.exitcode}"
    return f"worker rank {rank} failed: {last}"


def _write_failed_summary(run: RunDir, cfg: TrainConfig, message: str) -> None:
    epochs = read_jsonl(run.epochs, notes=[])  # a worker killed mid-write may leave half a last line
    write_json_atomic(run.summary, {"status": "failed", "error": message, "model": cfg.model,
                                    "dataset": cfg.dataset, "world_size": cfg.nproc * cfg.nnodes,
                                    "epochs": len(epochs), "epochs_planned": cfg.epochs,
                                    "resumable": run.checkpoint.exists()})


def _print_summary(run: RunDir) -> None:
    from scaletrain.summary_view import print_summary

    print_summary(run)
