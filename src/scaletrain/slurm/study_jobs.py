"""`scaletrain slurm study`: one batch job per point and repeat, their run directories where the study's
own runner puts them (STUDY/points/<id>/r<k>/), and study.json gathered as each job ends."""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scaletrain.errors import UserError
from scaletrain.rundir import StudyDir, read_summary
from scaletrain.slurm import jobs, submit
from scaletrain.slurm.command import train_argv
from scaletrain.slurm.options import SlurmOptions
from scaletrain.slurm.script import BatchJob, render
from scaletrain.slurm.train_job import SCRIPT_SETS_PORT, check_cluster, check_here, refuse_node_flags
from scaletrain.study.grid import PER_RUN, Point, Threads, fair_threads, load_spec_file, points, resolve_spec, \
    validate_points
from scaletrain.study.results import study_entries
from scaletrain.study.runner import (PlannedRun, check_study_dir, error_line, planned_runs, prepare_run, recorded_spec,
                                     run_state, write_results, write_spec)


@dataclass(frozen=True)
class PointJob:
    """One repeat of one point, as a batch job."""

    run: PlannedRun
    """The point, the repeat and its run directory's state before this submission: new, unfinished (resumed),
    failed."""
    script_text: str
    script: Path
    job: jobs.Job | None = None


@dataclass(frozen=True)
class StudySubmission:
    study: StudyDir
    grid: list[Point]
    repeats: int
    completed: int
    """Runs already completed (not submitted again)."""
    jobs: list[PointJob]
    threads: Threads
    """Threads per rank of every point: --threads, the study's record, or each node's cores / the grid's largest."""


def submit_study(args: argparse.Namespace, opts: SlurmOptions, workdir: Path) -> StudySubmission:
    """Check every point, then (unless --dry-run) write a script per run still to do and submit them."""
    from scaletrain.distributed.launch.preflight import validate
    from scaletrain.study.cli import spec_from_args

    if getattr(args, "predict", False):
        raise UserError("--predict runs the prediction, the study and its validation in one process: on SLURM, "
                        "run `scaletrain predict` first and `scaletrain validate` once the jobs are done")
    spec = spec_from_args(args)
    refuse_node_flags(spec.train, " (a study setting)")
    check_cluster(opts, args.dry_run)
    study = StudyDir(Path(args.out).resolve())
    # the rule `scaletrain study` follows, with the cores of the nodes, known only there (script.py)
    spec, threads = fair_threads(spec, None, recorded_spec(study))
    grid = points(spec)
    check_study_dir(study, spec)
    todo = planned_runs(study, grid, spec.repeats)
    on_nodes = {r.point.id: r.point.config.replace(nnodes=opts.nodes, master_port=SCRIPT_SETS_PORT) for r in todo}
    validate_points([replace(r.point, config=on_nodes[r.point.id]) for r in todo],
                    lambda cfg: check_here(cfg, opts, validate))
    if not args.dry_run:
        jobs.refuse_if_queued(study.root, "study")
    planned = []
    for r in todo:
        text = render(_batch_job(study, r.point, r.repeat, opts, workdir, threads))
        planned.append(PointJob(r, text, script_path(study, r.point.id, r.repeat)))
    completed = len(grid) * spec.repeats - len(todo)
    if args.dry_run:
        return StudySubmission(study, grid, spec.repeats, completed, planned, threads)
    write_spec(study, spec)
    jobs.slurm_dir(study.root).mkdir(parents=True, exist_ok=True)
    submitted = []
    for pj in planned:
        prepare_run(study, pj.run, resume=True)
        pj.script.write_text(pj.script_text)
    gather(study.root, write_report=False)  # study.json lists every point (pending) before any job ends
    try:
        for pj in planned:
            job_id = submit.sbatch(pj.script)
            point, k = pj.run.point.id, pj.run.repeat
            submitted.append(replace(pj, job=jobs.Job(job_id=job_id, script=str(pj.script),
                                                      output=str(study.log(point, k)),
                                                      run=str(study.run(point, k)), submitted_at=jobs.now())))
    finally:  # what was submitted is recorded even when a later sbatch fails
        jobs.record_jobs(study.root, [pj.job for pj in submitted if pj.job is not None])
    return StudySubmission(study, grid, spec.repeats, completed, submitted, threads)


def script_path(study: StudyDir, point_id: str, k: int) -> Path:
    return jobs.slurm_dir(study.root) / f"{point_id}-r{k}.sbatch"


def _batch_job(study: StudyDir, p: Point, k: int, opts: SlurmOptions, workdir: Path, threads: Threads) -> BatchJob:
    """The point's own settings spelt out (as the study's runner launches it), its log where the runner's is."""
    settings = {key: v for key, v in p.config.to_dict().items() if key not in PER_RUN}
    argv = train_argv(settings)
    name = opts.job_name or f"scaletrain-{study.root.name}-{p.id}-r{k}"
    gather_cmd = [sys.executable, "-m", "scaletrain", "slurm", "gather", str(study.root)]
    return BatchJob(options=opts, job_name=name, run=study.run(p.id, k), train=argv,
                    output=str(study.log(p.id, k)), workdir=workdir.resolve(), after=[gather_cmd],
                    threads_from_cores=threads.processes if threads.source == "node" else None,
                    title=f"scaletrain study {study.root}: point {p.id}, repeat {k}")


def run_record(study: StudyDir, point_id: str, k: int) -> dict[str, Any]:
    """A run's study.json record from its directory: completed, failed (its summary says so) or pending."""
    run = study.run(point_id, k)
    state = run_state(run)
    record: dict[str, Any] = {"dir": study.relative(run), "status": "pending", "summary": None, "error": None}
    if state == "completed":
        record |= {"status": "completed", "summary": read_summary(run, strict=False)}
    elif state == "failed":
        log = study.log(point_id, k)
        text = log.read_text(errors="replace") if log.is_file() else ""
        summary = read_summary(run, strict=False)
        record |= {"status": "failed", "summary": summary, "error": error_line(text, summary, 1)}
    return record


def gather(root: str | Path, write_report: bool = True) -> dict[str, int]:
    """Rewrite study.json from the points' run directories; the study's report too once none is pending.
    Every point's job runs this when its training step ends. Returns the runs by status."""
    from scaletrain.report import write_study_report

    study = StudyDir(Path(root))
    if not study.spec.is_file():
        raise UserError(f"{root} holds no study.toml: give the study directory of `scaletrain slurm study --out`")
    spec = resolve_spec(load_spec_file(study.spec), {}, {}, None)
    grid = points(spec)
    with jobs.locked(study.root):
        runs = {p.id: [run_record(study, p.id, k) for k in range(spec.repeats)] for p in grid}
        write_results(study, study_entries(grid, runs))
        counts = {s: sum(r["status"] == s for rs in runs.values() for r in rs) for s in ("completed", "failed",
                                                                                           "pending")}
        if write_report and counts["pending"] == 0 and counts["completed"]:
            with contextlib.suppress(UserError):  # e.g. nothing to plot: study.json is what matters
                write_study_report(study.root)
    return counts


__all__ = ["PointJob", "StudySubmission", "submit_study", "gather", "run_record", "script_path"]
