"""How a launch ended, told once: the summary table, a failed summary.json, the resume command."""

from __future__ import annotations

import sys

from scaletrain.config import TrainConfig
from scaletrain.rundir import RunDir


def rank_namer(cfg: TrainConfig):
    """`rank 1`, or `parameter server 0 (rank 2)` for the servers of a ps-* run."""
    first_server, servers = cfg.layout.trainers, cfg.layout.servers

    def name(rank: int) -> str:
        if rank >= first_server:
            return f"parameter server {rank - first_server} (rank {rank})"
        return f"worker rank {rank}" if servers else f"rank {rank}"
    return name


def print_resume_hint(run: RunDir, cfg: TrainConfig, stopped: str | None = None) -> None:
    """Every ending that left a checkpoint says how to continue (`stopped`: the summary's status of a run
    that ended early on purpose: "stopped" by --stop-after, "preempted" by a preemption request)."""
    if cfg.launch.node_rank != 0 or not run.checkpoint.exists():
        return
    why = {"stopped": "stopped as asked (--stop-after)",
           "preempted": "preempted: checkpointed at the step it had reached (exit 75)"}.get(
        stopped or "", "the run can continue from its last checkpoint")
    print(f"{why}: scaletrain train --resume --out {run.root}", file=sys.stderr)


def print_summary(run: RunDir, cfg: TrainConfig) -> None:
    from scaletrain.console.summary import print_summary

    print_summary(run, cfg.layout.replicas)
