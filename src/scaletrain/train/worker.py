"""The process the launcher starts for each rank: its strategy decides its role, then it trains or serves."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

from scaletrain.comm import registry
from scaletrain.comm.strategy import SERVER, closing
from scaletrain.config import TrainConfig, config_from_dict
from scaletrain.config.specs import without_failures
from scaletrain.distributed import failure
from scaletrain.distributed.rank import RankInfo, restart_count
from scaletrain.errors import UserError
from scaletrain.rundir import RunDir, keep_epochs_before
from scaletrain.train import restarts


def worker_main(cfg_dict: dict[str, Any], error_dir: str) -> None:
    """Entry point the elastic agent starts in each worker; a UserError becomes one line for the parent."""
    rank = RankInfo.from_env()
    cfg = config_from_dict(cfg_dict)
    heartbeat = failure.Heartbeat(error_dir, rank.rank)  # the launcher tells a stopped rank by its silence
    request_preemption_on(RunDir(Path(cfg.launch.out)))
    try:
        if restart_count():
            cfg = restarted(cfg, rank)
        run(cfg, rank)
    except UserError as e:
        failure.record_error(error_dir, None, rank.rank, e, user_error=True)
        sys.exit(2)
    except Exception as e:  # a bug, a user model's error, a peer gone: keep the cause and the traceback
        failure.record_error(error_dir, cfg.launch.out, rank.rank, e, user_error=False)
        sys.exit(1)
    heartbeat.stop()  # (a failed rank beats on until it has exited: the watchdog leaves it alone)


def run(cfg: TrainConfig, rank: RankInfo) -> dict[str, Any] | None:
    """Join the job through the strategy, train (or serve), tear down. Returns the summary on rank 0."""
    from scaletrain.distributed.allocator import settle
    from scaletrain.perf.precision import made_in
    from scaletrain.train.build import build_data_and_model
    from scaletrain.train.loop import Trainer

    settle(cfg.launch.allocator)  # a rank is a fresh process: glibc's thresholds fixed before its first step
    with made_in(cfg.model.precision), closing(registry.create(cfg, rank)) as strategy:
        if strategy.role == SERVER:
            strategy.serve(build_data_and_model(cfg)[1])
            return None
        return Trainer(cfg, strategy, sinks(cfg, strategy.rank, strategy.replica()[1])).fit()


def restarted(cfg: TrainConfig, rank: RankInfo) -> TrainConfig:
    """The elastic agent restarted this worker after a failure: go on from the run's latest checkpoint,
    or, when none was written yet, start again with the failed attempt's records cleared."""
    run_dir = RunDir(Path(cfg.launch.out))
    cfg = config_from_dict({**cfg.to_dict(), "inject": without_failures(cfg.faults.inject)})
    if run_dir.checkpoint.exists():
        return config_from_dict({**cfg.to_dict(), "resume": True})
    if rank.is_main:
        keep_epochs_before(run_dir.epochs, 0)
    keep_epochs_before(run_dir.metrics(rank.rank), 0)
    return cfg


def request_preemption_on(run_dir: RunDir) -> None:
    """SIGUSR1 (SLURM's warning before a time limit, sent to every process of the job) asks the run to
    checkpoint within 10 steps and end; without this handler it would kill the worker."""
    def request(signum, frame) -> None:
        try:
            run_dir.preempt.touch()
        except OSError:
            pass

    signal.signal(signal.SIGUSR1, request)


def sinks(cfg: TrainConfig, rank: RankInfo, replicas: int) -> list:
    """Where the loop's progress goes: rank 0's console (progress and epoch lines; samples/s over the
    `replicas` that share the global batch), TensorBoard on every rank."""
    from scaletrain.console.sink import ConsoleSink
    from scaletrain.export import tensorboard

    out: list = [ConsoleSink(cfg.optim.epochs, replicas, progress=cfg.launch.progress)] if rank.is_main else []
    if rank.is_main and restart_count():
        out.append(restarts.ResumedSink(RunDir(Path(cfg.launch.out)), restart_count()))
    if tensorboard.wanted(cfg.profile.tensorboard):
        out.append(tensorboard.ScalarSink(Path(cfg.launch.out), rank.rank, cfg.profile.tensorboard_every))
    return out
