"""`scaletrain train`: check the request, prepare the run directory, start workers via torch's elastic agent."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import uuid
from pathlib import Path

from scaletrain import checkpoint, failure, footprint
from scaletrain.config import TrainConfig, save_toml
from scaletrain.data import build_datasets, default_image_size
from scaletrain.dist import RankInfo, check_device_request, launched_externally, slurm_rendezvous
from scaletrain.errors import UserError
from scaletrain.models import build_model
from scaletrain.rundir import (RunDir, check_out_dir, create, keep_epochs_before, read_jsonl, remove_stale_temps,
                              write_json_atomic)


def validate(cfg: TrainConfig) -> None:
    """Every check of a training request that needs no run directory: the launch's shape, the device,
    the data, the model, the batch against the data. Writes nothing; `study` runs it for every point."""
    cfg.check_launch()
    device_type = check_device_request(cfg.device, cfg.nproc, cfg.precision)
    # estimated before building anything: digits is resized into memory, and a model is only built on
    # the meta device until it is known to fit
    size = cfg.image_size or default_image_size(cfg.dataset)
    hint = (f"lower --image-size (now {size}), --batch-size (now {cfg.batch_size}) or --width, "
            f"or start fewer processes (--nproc {cfg.nproc})")
    in_memory = footprint.dataset_bytes(cfg.dataset, size)
    footprint.check_fits(footprint.Footprint(dataset=in_memory), cfg.nproc, footprint.available_bytes("cpu"),
                         "cpu", hint)
    data = build_datasets(cfg.dataset, image_size=cfg.image_size, seed=cfg.seed,
                          synthetic_samples=cfg.synthetic_samples, synthetic_classes=cfg.synthetic_classes,
                          augment=False)

    def factory():
        return build_model(cfg.model, num_classes=data.num_classes, in_channels=data.in_channels,
                           image_size=data.image_size, stem=cfg.stem, width=cfg.width)

    estimate = footprint.model_bytes(factory, cfg.batch_size, data.in_channels, data.image_size, cfg.optimizer,
                                     cfg.precision)
    if estimate is None:
        factory()  # a model the meta device cannot run: build it for real, to see that it builds
    else:
        need = footprint.Footprint(*estimate, dataset=in_memory)
        footprint.check_fits(need, cfg.nproc, footprint.available_bytes(device_type), device_type, hint)
    trainers = cfg.nproc * cfg.nnodes - (cfg.ps_servers if cfg.strategy.startswith("ps-") else 0)
    per_rank = -(-len(data.train) // trainers)  # DistributedSampler pads every rank to the same count
    if per_rank < cfg.batch_size:
        most = max(1, len(data.train) // cfg.batch_size)
        raise UserError(f"--batch-size {cfg.batch_size} x {trainers} training ranks is more than the "
                        f"{len(data.train)} training samples of {cfg.dataset}: lower --batch-size to "
                        f"{max(1, per_rank)} or use at most {most} training ranks")


def preflight(cfg: TrainConfig) -> RunDir:
    """Every check that can be made before a worker starts; writes nothing."""
    validate(cfg)
    # the run directory is node 0's to check and create (other nodes of a shared file system join it)
    run = check_out_dir(cfg.out, cfg.resume) if cfg.node_rank == 0 else RunDir(Path(cfg.out))
    if cfg.resume and cfg.node_rank == 0:
        ckpt = checkpoint.load(run.checkpoint, mmap=True)
        checkpoint.check_resume(ckpt, cfg.to_dict(), run.checkpoint, default_image_size)
        _note_world_change(ckpt, cfg)
    return run


def _note_world_change(ckpt: dict, cfg: TrainConfig) -> None:
    """A resume on another number of processes is allowed, but it is not the same run: say so."""
    before, now = ckpt.get("world_size"), cfg.nproc * cfg.nnodes
    if cfg.strategy.startswith("ps-"):  # shards and data order depend on the layout: refused before launching
        from scaletrain.ps.resume import saved_state
        saved_state(cfg, now)
    if before is None or before == now:
        return
    batch = ckpt["config"].get("batch_size")
    print(f"note: the run was trained with {before} processes (global batch {before * batch}), this resume "
          f"uses {now} (global batch {now * cfg.batch_size}): the LR schedule is re-planned for the new "
          "steps per epoch and the data order does not replay; --nproc "
          f"{before // cfg.nnodes if before % cfg.nnodes == 0 else before} continues it exactly", file=sys.stderr)


def free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        _bind(s, addr, 0)
        return s.getsockname()[1]


def check_port(addr: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        _bind(s, addr, port)


def _bind(s: socket.socket, addr: str, port: int) -> None:
    """Bind the rendezvous address here (node 0 hosts it): a busy port, or an address that is not this
    machine's, is one line."""
    try:
        s.bind((addr, port))
    except socket.gaierror:
        raise UserError(f"--master-addr {addr} does not resolve to an address: give node 0's IP address "
                        "(or leave it out on one node)") from None
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise UserError(f"master port {port} on {addr} is already in use (another job?): pass a free "
                            "--master-port, or leave it out to pick one automatically") from None
        raise UserError(f"--master-addr {addr} is not an address of this machine ({e.strerror}), and node 0 "
                        "hosts the rendezvous: on one node leave --master-addr out (127.0.0.1); on node 0 of "
                        "several, give its own address that the other nodes reach") from None


# set in the agents that an isolated launch starts: the parent already checked and created the run
AGENT_OF_ISOLATED = "SCALETRAIN_ISOLATED_AGENT"


def train(cfg: TrainConfig) -> int:
    """Run a training job; returns the process exit code."""
    if launched_externally():
        return _join_external_launch(cfg)
    if os.environ.get(AGENT_OF_ISOLATED):
        return _launch_local(cfg, RunDir(Path(cfg.out)), cfg.master_port)
    run = preflight(cfg)
    port = cfg.master_port
    if port is None:
        port = free_port(cfg.master_addr)
    elif cfg.node_rank == 0:
        check_port(cfg.master_addr, port)
    # every check has passed: only now is the run directory written
    if cfg.node_rank == 0:
        create(run)
        remove_stale_temps(run)
        if not cfg.resume:  # a failed earlier attempt without a checkpoint: start its records afresh
            for path in [run.epochs, *run.root.glob("metrics-rank*.jsonl")]:
                keep_epochs_before(path, 0)
        save_toml(cfg, run.config)
    else:
        run.root.mkdir(parents=True, exist_ok=True)
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
    launch_cfg = launch_config(cfg.nproc, cfg.nnodes, cfg.node_rank, cfg.master_addr, port, cfg.local_addr,
                               cfg.timeout)
    if cfg.nnodes > 1:
        print(f"node {cfg.node_rank} of {cfg.nnodes}: waiting up to {cfg.timeout:g} s (--timeout) for the "
              f"other nodes at {cfg.master_addr}:{port}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="scaletrain-err-") as err_dir:
        watchdog = failure.Watchdog(err_dir)
        try:
            with no_exit_barrier(cfg.strategy == "ps-async"):
                elastic_launch(launch_cfg, worker_main)(cfg.to_dict(), err_dir)
        except ChildFailedError as e:
            exitcodes = {rank: f.exitcode for rank, f in e.failures.items()}
            message, bad_input = failure.explain(failure.read_outcome(err_dir, exitcodes, cfg.timeout),
                                                 rank_namer(cfg))
            if cfg.node_rank == 0:
                _write_failed_summary(run, cfg, message)
            print(f"error: {message}", file=sys.stderr)
            if not bad_input:  # bad input is fixed first; the hint would repeat a refused command
                _print_resume_hint(run, cfg)
            return 2 if bad_input else 1
        except (KeyboardInterrupt, SignalException) as e:
            signum = getattr(e, "sigval", signal.SIGINT)
            if cfg.node_rank == 0:
                _write_failed_summary(run, cfg, f"interrupted ({signal.Signals(signum).name})")
            print(f"interrupted by {signal.Signals(signum).name}", file=sys.stderr)
            _print_resume_hint(run, cfg)
            return 128 + int(signum)
        except Exception as e:  # the rendezvous: a node that never comes, an unreachable node 0
            if not _is_rendezvous_failure(e):
                raise
            raise UserError(f"the nodes did not meet at {cfg.master_addr}:{port} within --timeout "
                            f"{cfg.timeout:g} s ({type(e).__name__}): start node 0 (--node-rank 0) too, with "
                            f"--nnodes {cfg.nnodes} and the same --master-port on every node, and check that "
                            f"this node reaches {cfg.master_addr}:{port} (firewall, address)") from None
        finally:
            watchdog.stop()
    if cfg.node_rank == 0:
        _print_summary(run)
        summary = read_summary(run)
        if summary.get("status") == "stopped":
            _print_resume_hint(run, cfg, stopped=True)
    return 0


def _is_rendezvous_failure(e: Exception) -> bool:
    """The agent's own failures to meet: the rendezvous, its store (DistError and its kinds), timeouts."""
    import torch.distributed as dist

    names = " ".join(t.__name__.lower() for t in type(e).__mro__)
    return isinstance(e, dist.DistError) or any(word in names for word in ("rendezvous", "timeout"))


def rank_namer(cfg: TrainConfig):
    """`rank 1`, or `parameter server 0 (rank 2)` for the servers of a ps-* run."""
    world = cfg.nproc * cfg.nnodes
    first_server = world - cfg.ps_servers if cfg.strategy.startswith("ps-") else world

    def name(rank: int) -> str:
        if rank >= first_server:
            return f"parameter server {rank - first_server} (rank {rank})"
        return f"worker rank {rank}" if cfg.strategy.startswith("ps-") else f"rank {rank}"
    return name


def _print_resume_hint(run: RunDir, cfg: TrainConfig, stopped: bool = False) -> None:
    """Every ending that left a checkpoint says how to continue."""
    if cfg.node_rank != 0 or not run.checkpoint.exists():
        return
    why = "stopped as asked (--stop-after)" if stopped else "the run can continue from its last checkpoint"
    print(f"{why}: scaletrain train --resume --out {run.root}", file=sys.stderr)


def read_summary(run: RunDir) -> dict:
    try:
        data = json.loads(run.summary.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def launch_config(nproc: int, nnodes: int, node_rank: int, master_addr: str, port: int,
                  local_addr: str | None = None, timeout_s: float = 180.0):
    """The elastic agent's settings: c10d rendezvous on one node; static node ranks across several."""
    from torch.distributed.launcher.api import LaunchConfig

    common = dict(nproc_per_node=nproc, max_restarts=0, monitor_interval=0.1, start_method="spawn",
                  rdzv_endpoint=f"{master_addr}:{port}")
    if nnodes == 1:
        return LaunchConfig(min_nodes=1, max_nodes=1, run_id=f"scaletrain-{uuid.uuid4().hex[:8]}",
                            rdzv_backend="c10d", rdzv_configs={"join_timeout": timeout_s}, **common)
    return LaunchConfig(min_nodes=nnodes, max_nodes=nnodes, run_id="scaletrain", rdzv_backend="static",
                        rdzv_configs={"rank": node_rank, "timeout": timeout_s}, local_addr=local_addr, **common)


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
        if name.startswith(("torch.distributed.elastic", "torch.multiprocessing")):
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
    except KeyboardInterrupt:
        code = 130
    except Exception as e:  # keep the cause: one line here, the traceback in RUN/errors/rank{r}.txt
        rank_id = RankInfo.from_env().rank
        with tempfile.TemporaryDirectory() as tmp:
            failure.record_error(tmp, cfg.out, rank_id, e, user_error=False)
            record = json.loads(Path(tmp, f"rank{rank_id}.json").read_text())
        where = f" [traceback: {record['traceback']}]" if record["traceback"] else ""
        print(f"error: {rank_namer(cfg)(rank_id)} failed: {record['line']}{where}", file=sys.stderr)
        code = 1
    finally:
        # Leave without C++ static destructors, as multiprocessing workers do: after set_num_threads and
        # a gloo process group, PyTorch 2.13 sometimes aborts in them ("terminate called without an
        # active exception", seen in about 1 of 8 torchrun launches here), failing a finished job.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _write_failed_summary(run: RunDir, cfg: TrainConfig, message: str) -> None:
    epochs = read_jsonl(run.epochs, notes=[])  # a worker killed mid-write may leave half a last line
    write_json_atomic(run.summary, {"status": "failed", "error": message, "model": cfg.model,
                                    "dataset": cfg.dataset, "world_size": cfg.nproc * cfg.nnodes,
                                    "epochs": len(epochs), "epochs_planned": cfg.epochs,
                                    "resumable": run.checkpoint.exists()})


def _print_summary(run: RunDir) -> None:
    from scaletrain.summary_view import print_summary

    print_summary(run)
