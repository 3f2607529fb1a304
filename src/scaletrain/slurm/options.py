"""The SLURM side of a job (`--nodes`, `--partition`, `--time`, ...): flags, checks and SLURM's time formats."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from scaletrain.errors import UserError

WARNING_S = 90
"""Seconds before the time limit at which SLURM sends the batch shell SIGUSR1 (it may come up to a
minute earlier): time to finish the step and write a checkpoint."""

TIME_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 30, 2:00:00, 1-12)"
_UNLIMITED = ("unlimited", "infinite")


@dataclass(frozen=True, kw_only=True)
class SlurmOptions:
    """What a job asks SLURM for; validated once, before anything is written."""

    nodes: int = 1
    """Nodes of the allocation: one launch agent per node, each starting the node's --nproc workers."""
    gpus_per_node: int | None = None
    """GPUs on each node (--nproc defaults to it)."""
    cpus_per_task: int | None = None
    """CPUs for each node's launch agent and all its workers (one task per node)."""
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    """Time limit, in one of SLURM's formats."""
    qos: str | None = None
    exclusive: bool = False
    job_name: str | None = None

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise UserError(f"--nodes must be at least 1 (got {self.nodes})")
        for flag, value in (("--gpus-per-node", self.gpus_per_node), ("--cpus-per-task", self.cpus_per_task)):
            if value is not None and value < 1:
                raise UserError(f"{flag} must be at least 1 (got {value}): leave it out to take SLURM's default")
        for flag, value in (("--partition", self.partition), ("--account", self.account), ("--qos", self.qos),
                            ("--job-name", self.job_name)):
            if value is not None and (not value.strip() or re.search(r"\s", value)):
                raise UserError(f"{flag} {value!r}: give one word without spaces")
        if self.time is not None:
            time_limit_s(self.time)

    @property
    def time_s(self) -> int | None:
        """The time limit in seconds; None without one (or UNLIMITED)."""
        return None if self.time is None else time_limit_s(self.time)


def time_limit_s(text: str) -> int | None:
    """SLURM's --time in seconds (None for UNLIMITED); one line naming the formats when it is none of them."""
    value = text.strip()
    if value.lower() in _UNLIMITED:
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
    if not m:
        raise UserError(f"--time {text!r} is not a SLURM time: give {TIME_FORMATS}, or UNLIMITED")
    days, first, second, third = (None if g is None else int(g) for g in m.groups())
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        d, h, mi, s = days, first, second or 0, third or 0
        bad = h > 23 or mi > 59 or s > 59
    elif third is not None:  # HH:MM:SS
        d, h, mi, s = 0, first, second, third
        bad = mi > 59 or s > 59
    else:  # MM or MM:SS (the minutes may run past 59)
        d, h, mi, s = 0, 0, first, second or 0
        bad = s > 59
    if bad:
        raise UserError(f"--time {text!r}: hours after a day count go up to 23, minutes and seconds after a "
                        f"colon up to 59: give {TIME_FORMATS}")
    total = ((d * 24 + h) * 60 + mi) * 60 + s
    if total == 0:
        raise UserError(f"--time {text!r} is no time at all: give a limit such as 30 (minutes) or 2:00:00, "
                        "or UNLIMITED")
    return total


def add_options(p: argparse.ArgumentParser, dry_run: bool = True) -> None:
    """The SLURM flags; `dry_run=False` where the command already has a --dry-run of its own (study)."""
    g = p.add_argument_group("SLURM settings", "what the job asks SLURM for (sbatch's own flags of that name)")
    g.add_argument("--nodes", type=int, default=1, help="nodes: one launch agent per node (default: 1)")
    g.add_argument("--gpus-per-node", type=int, help="GPUs per node; --nproc defaults to it")
    g.add_argument("--cpus-per-task", type=int, help="CPUs of each node's task: its launch agent and all its "
                                                     "workers (default: SLURM's)")
    g.add_argument("--partition", help="partition to run in (default: the cluster's default)")
    g.add_argument("--account", help="account to charge")
    g.add_argument("--time", help=f"time limit: {TIME_FORMATS}; SIGUSR1 comes {WARNING_S} s before it "
                                  "(the run checkpoints and the job requeues itself)")
    g.add_argument("--qos", help="quality of service")
    g.add_argument("--exclusive", action="store_true", help="whole nodes, shared with no other job")
    g.add_argument("--job-name", help="job name (default: scaletrain-<run or study folder>)")
    if dry_run:
        g.add_argument("--dry-run", action="store_true", help="print the batch script; write and submit nothing")


def options_from_args(args: argparse.Namespace) -> SlurmOptions:
    return SlurmOptions(nodes=args.nodes, gpus_per_node=args.gpus_per_node, cpus_per_task=args.cpus_per_task,
                        partition=args.partition, account=args.account, time=args.time, qos=args.qos,
                        exclusive=args.exclusive, job_name=args.job_name)


SLURM_FLAGS = ("nodes", "gpus_per_node", "cpus_per_task", "partition", "account", "time", "qos", "exclusive",
               "job_name", "dry_run")
"""The namespace keys of the flags above, kept apart from the train settings."""
