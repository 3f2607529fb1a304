"""`scaletrain slurm train`: check the request, write RUN/slurm/job.sbatch and submit it."""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.config import TrainConfig, resolve_train_config, save_toml
from scaletrain.errors import UserError
from scaletrain.rundir import check_out_dir
from scaletrain.slurm import jobs, submit
from scaletrain.slurm.command import NODE_SET, train_argv
from scaletrain.slurm.options import SlurmOptions
from scaletrain.slurm.script import BatchJob, render


SCRIPT_SETS_PORT = 20000


@dataclass(frozen=True)
class Submission:
    """What was written and submitted (job None: a dry run, nothing written)."""

    script_text: str
    script: Path
    output: str
    run: Path
    job: jobs.Job | None


def refuse_node_flags(given: Mapping[str, Any], where: str = "") -> None:
    """The flags of a node's place in the job come from the allocation, on every node."""
    set_here = [k for k in NODE_SET if k in given]
    if set_here:
        flag = "--" + set_here[0].replace("_", "-")
        raise UserError(f"{flag}{where} is set by the batch script from the allocation on every node: "
                        "leave it out (use --nodes for the number of nodes)")


def train_config(given: dict[str, Any], config_file: str | None, nodes: int) -> TrainConfig:
    """The run's configuration as `scaletrain train` will resolve it on node 0 (defaults < the run's saved
    config on --resume < --config file < flags), with --nnodes from --nodes."""
    # the port is the script's to choose on each start; any one lets the launch's shape be checked here
    return resolve_train_config({**given, "nnodes": nodes, "master_port": SCRIPT_SETS_PORT}, config_file)


def check_here(cfg: TrainConfig, opts: SlurmOptions, validate: Callable[[TrainConfig], None]) -> None:
    """What can be checked on this (login) node: everything `train` checks when the job runs where this
    machine would run it (the CPU); for a GPU job, only the launch's shape (the GPUs are on the nodes)."""
    if opts.gpus_per_node is not None and cfg.launch.nproc > opts.gpus_per_node:
        raise UserError(f"--nproc {cfg.launch.nproc} is more processes than --gpus-per-node {opts.gpus_per_node}: "
                        "one process per GPU (leave --nproc out to take --gpus-per-node)")
    if opts.gpus_per_node is None and cfg.launch.device != "cuda":
        validate(cfg)
    else:
        cfg.check_launch()


def check_cluster(opts: SlurmOptions, dry_run: bool) -> None:
    """sbatch here, the partition known; a dry run asks SLURM only when it can (sinfo on PATH and a
    controller answering), and otherwise says that the partition went unchecked."""
    if not dry_run:
        submit.require("sbatch")
        # asked even without --partition: a controller that does not answer is one line before anything is written
        submit.check_partition(opts.partition, submit.partitions())
        return
    if opts.partition is None:
        return
    try:
        known = submit.partitions() if shutil.which("sinfo") else None
    except UserError:
        known = None
    if known is None:
        print(f"note: no SLURM controller answers here: --partition {opts.partition} is not checked (sbatch will)",
              file=sys.stderr)
    elif opts.partition not in known:
        submit.check_partition(opts.partition)


def submit_train(given: dict[str, Any], config_file: str | None, opts: SlurmOptions, workdir: Path,
                 dry_run: bool) -> Submission:
    """Check everything, then (unless a dry run) write RUN/slurm/job.sbatch, submit it and record the job."""
    from scaletrain.distributed.launch.preflight import validate

    refuse_node_flags(given)
    check_cluster(opts, dry_run)  # the cheap checks first: sbatch here, the partition known
    if opts.gpus_per_node is not None and "nproc" not in given:  # one process per GPU
        given = {**given, "nproc": opts.gpus_per_node}
    cfg = train_config(given, config_file, opts.nodes)
    check_here(cfg, opts, validate)
    run = check_out_dir(cfg.launch.out, cfg.launch.resume)
    root = run.root.resolve()
    if not dry_run:
        jobs.refuse_if_queued(root, "run")
    settings = {k: v for k, v in given.items() if k != "resume"}  # the script adds --resume on every start
    argv = train_argv(settings, config_file and str(Path(config_file).resolve()))  # that finds a checkpoint
    script = jobs.slurm_dir(root) / "job.sbatch"
    output = str(jobs.slurm_dir(root) / "job-%j.out")
    text = render(BatchJob(options=opts, job_name=opts.job_name or f"scaletrain-{root.name}", run=root,
                           train=argv, output=output, workdir=workdir.resolve(),
                           title=f"scaletrain train into {root}"))
    if dry_run:
        return Submission(text, script, output, root, None)
    # a fresh run directory holding only slurm/ would not look like a run to `train`: its config goes first
    fresh = not cfg.launch.resume and not run.config.exists()
    made = [p for p in (root, script.parent) if not p.exists()]
    script.parent.mkdir(parents=True, exist_ok=True)  # before sbatch: the job's output goes there
    if fresh:
        save_toml(cfg.replace(out=str(root)), run.config)
    script.write_text(text)
    try:
        job_id = submit.sbatch(script)
    except UserError:  # refused by SLURM (an account, a limit): leave nothing of this attempt behind
        if fresh:
            run.config.unlink(missing_ok=True)
        if made:
            script.unlink(missing_ok=True)
            for folder in reversed(made):
                with contextlib.suppress(OSError):
                    folder.rmdir()
        raise
    job = jobs.Job(job_id=job_id, script=str(script), output=output.replace("%j", job_id), run=str(root),
                   submitted_at=jobs.now())
    jobs.record_jobs(root, [job])
    return Submission(text, script, job.output, root, job)


__all__ = ["Submission", "submit_train", "train_config", "check_here", "check_cluster", "refuse_node_flags"]
