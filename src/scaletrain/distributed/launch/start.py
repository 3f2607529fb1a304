"""`scaletrain train`: check the request, prepare the run directory, start the workers."""

from __future__ import annotations

import os
from pathlib import Path

from scaletrain.comm.registry import strategy_class
from scaletrain.config import TrainConfig, save_toml
from scaletrain.distributed.launch.external import join_external_launch
from scaletrain.distributed.launch.isolated import AGENT_OF_ISOLATED, launch_isolated
from scaletrain.distributed.launch.local import launch_local
from scaletrain.distributed.launch.preflight import check_port, free_port, preflight
from scaletrain.distributed.rank import launched_externally
from scaletrain.rundir import RunDir, create, keep_epochs_before, remove_stale_temps
from scaletrain.train import restarts


def train(cfg: TrainConfig) -> int:
    """Run a training job; returns the process exit code."""
    if launched_externally(node_flags=cfg.launch.nnodes > 1):
        return join_external_launch(cfg)
    if os.environ.get(AGENT_OF_ISOLATED):
        return launch_local(cfg, RunDir(Path(cfg.launch.out)), cfg.launch.master_port)
    run, cfg = preflight(cfg)
    port = cfg.launch.master_port
    if port is None:
        port = free_port(cfg.launch.master_addr)
    elif cfg.launch.node_rank == 0:
        check_port(cfg.launch.master_addr, port)
    # every check has passed: only now is the run directory written
    if cfg.launch.node_rank == 0:
        create(run)
        remove_stale_temps(run)
        run.preempt.unlink(missing_ok=True)  # a request the previous invocation has answered
        if not cfg.launch.resume:  # a failed earlier attempt without a checkpoint: start its records afresh
            for path in [run.epochs, *run.root.glob("metrics-rank*.jsonl")]:
                keep_epochs_before(path, 0)
            restarts.path_of(run).unlink(missing_ok=True)
        save_toml(cfg, run.config)
    else:
        run.root.mkdir(parents=True, exist_ok=True)
    if strategy_class(cfg.strategy.name).agent_per_rank and cfg.launch.nnodes == 1 and cfg.launch.nproc > 1:
        return launch_isolated(cfg, run, port)
    return launch_local(cfg, run, port)
