"""What `scaletrain slurm` prints: the job ids and how to follow them."""

from __future__ import annotations

import shlex
from pathlib import Path

from rich.console import Console

from scaletrain.grid import Grid, rich_table
from scaletrain.plan.measure import steps_said
from scaletrain.slurm.options import SlurmOptions
from scaletrain.slurm.plan_jobs import PlanSubmission
from scaletrain.slurm.study_jobs import StudySubmission
from scaletrain.slurm.train_job import Submission
from scaletrain.study.view import threads_line


def _where(opts: SlurmOptions) -> str:
    parts = [f"{opts.nodes} node{'s' * (opts.nodes != 1)}"]
    parts += [f"{opts.gpus_per_node} GPUs/node"] * (opts.gpus_per_node is not None)
    parts += [f"partition {opts.partition}"] * (opts.partition is not None)
    parts += [f"time {opts.time}"] * (opts.time is not None)
    return ", ".join(parts)


def _path(path: str | Path) -> str:
    """A path as short as it is unambiguous: relative to here when below it."""
    p = Path(path)
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def print_train(console: Console, sub: Submission, opts: SlurmOptions) -> None:
    job = sub.job
    if job is None:
        console.print(sub.script_text, end="", markup=False, highlight=False, soft_wrap=True)
        return
    out = _path(job.output)
    console.print(f"submitted job {job.job_id}: scaletrain train into {_path(sub.run)} ({_where(opts)})")
    console.print(f"  script   {_path(sub.script)}")
    console.print(f"  output   {out}")
    console.print(f"  follow   squeue -j {job.job_id}")
    for how in (f"sacct -j {job.job_id}", f"tail -f {shlex.quote(out)}", f"scaletrain watch {shlex.quote(_path(sub.run))}"):
        console.print(f"           {how}")
    console.print("a requeued start (preemption, the time limit's warning, scontrol requeue) resumes from the "
                  "run's checkpoint", soft_wrap=True)


def print_study(console: Console, sub: StudySubmission, opts: SlurmOptions, dry_run: bool) -> None:
    total = len(sub.grid) * sub.repeats
    root = _path(sub.study.root)
    title = (f"study {root}: {len(sub.jobs)} of {total} runs to submit (dry run)" if dry_run else
             f"study {root}: {len(sub.jobs)} jobs submitted ({_where(opts)})")
    grid = Grid(title, ["point", "repeat", "job" if not dry_run else "run now", "log"], text_columns=(0, 2, 3))
    for pj in sub.jobs:
        run = pj.run
        state = {"unfinished": "resumes", "failed": "starts again"}.get(run.state, "new")
        grid.rows.append([run.point.id, str(run.repeat), pj.job.job_id if pj.job else state,
                          _path(sub.study.log(run.point.id, run.repeat))])
    console.print(rich_table(grid))
    console.print(threads_line(sub.threads))
    if sub.completed:
        console.print(f"{sub.completed} of {total} runs already completed: not submitted again")
    if dry_run:
        if sub.jobs:
            first = sub.jobs[0]
            console.print(f"the script of {first.run.point.id} r{first.run.repeat} (the others differ in the point's "
                          "settings, run directory and log):")
            console.print(first.script_text, end="", markup=False, highlight=False, soft_wrap=True)
        console.print("nothing written, nothing submitted")
        return
    if not sub.jobs:
        console.print(f"nothing to submit: scaletrain report {shlex.quote(root)}")
        return
    ids = ",".join(pj.job.job_id for pj in sub.jobs if pj.job)
    console.print(f"follow: squeue -j {ids}   |   sacct -j {ids}   |   scaletrain watch "
                  f"{shlex.quote(root)}/points/<id>/r<k>")
    console.print(f"each job rewrites {root}/study.json when it ends; once all are done: scaletrain report "
                  f"{shlex.quote(root)}")


def print_plan_validation(console: Console, sub: PlanSubmission, opts: SlurmOptions, dry_run: bool) -> None:
    root = _path(sub.root)
    title = (f"plan {root}: {len(sub.jobs)} brief runs to submit (dry run)" if dry_run else
             f"plan {root}: {len(sub.jobs)} jobs submitted ({_where(opts)})")
    grid = Grid(title, ["candidate", "round", "job" if not dry_run else "run", "log"], text_columns=(0, 2, 3))
    for rj in sub.jobs:
        grid.rows.append([f"#{rj.rank}", str(rj.round + 1), rj.job.job_id if rj.job else _path(rj.run),
                          _path(rj.run.with_suffix(".log"))])
    console.print(rich_table(grid))
    console.print(f"the top {sub.top} candidates, {sub.repeats} round(s) of {steps_said(sub.steps)} each, "
                  "submitted round by round in the predicted order")
    if dry_run:
        if sub.jobs:
            console.print(f"the script of #{sub.jobs[0].rank} round 1 (the others differ in the candidate, run "
                          "directory and log):")
            console.print(sub.jobs[0].script_text, end="", markup=False, highlight=False, soft_wrap=True)
        console.print("nothing written, nothing submitted")
        return
    ids = ",".join(rj.job.job_id for rj in sub.jobs if rj.job)
    console.print(f"follow: squeue -j {ids}   |   sacct -j {ids}")
    console.print(f"each job compares the runs done so far with the plan when it ends ({root}/plan.json "
                  f"`validation`, {root}/report.html); by hand: scaletrain slurm gather {shlex.quote(root)}")
