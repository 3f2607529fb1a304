"""`scaletrain slurm validate-plan DIR`: plan --validate's brief runs as batch jobs on the plan's own nodes, one job
per candidate and round, submitted round by round in the predicted order (what `plan --validate` interleaves
here), into the run directories the local validation uses (DIR/validation/c<rank>/r<k>, the job's output beside
each as r<k>.log). Every job, when its training step ends, runs `scaletrain slurm gather DIR`, which compares the
runs completed so far with the plan (plan/agreement.py) into plan.json's `validation` and the report."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scaletrain.errors import UserError
from scaletrain.slurm import jobs, submit
from scaletrain.slurm.options import SlurmOptions
from scaletrain.slurm.script import PREEMPTED, BatchJob, render
from scaletrain.slurm.train_job import check_cluster

JOBS_KEY = "validation_jobs"
"""plan.json's record of what was submitted: {executor, top, repeats, steps}; the gatherer reads it."""


@dataclass(frozen=True)
class RunJob:
    """One brief run of one candidate in one round, as a batch job."""

    rank: int
    round: int
    run: Path
    script: Path
    script_text: str
    job: jobs.Job | None = None


@dataclass(frozen=True)
class PlanSubmission:
    root: Path
    top: int
    repeats: int
    steps: int | None  # None: plan/measure.steps_for's, each candidate's own
    jobs: list[RunJob]


def read_plan(root: Path) -> dict[str, Any]:
    from scaletrain.plan.present import read_plan as read
    from scaletrain.rundir import PLAN

    if not (root / PLAN).is_file():
        raise UserError(f"{root} holds no {PLAN}: give the --out of `scaletrain plan`")
    return read(root)


def check_nodes(plan: dict[str, Any], opts: SlurmOptions) -> None:
    """The jobs' allocation is the plan's: its nodes, and on a GPU plan a GPU for each of its processes."""
    req = plan["request"]
    if req.get("testbed"):
        raise UserError("the plan is of this machine's testbed: validate it here with `scaletrain plan --validate`")
    if opts.nodes != req["nodes"]:
        raise UserError(f"--nodes {opts.nodes}: the plan is of {req['nodes']} node(s), each candidate runs on them: "
                        f"give --nodes {req['nodes']}")
    on_gpus = any(c.get("memory_kind") == "cuda" for c in plan["ranked"][:1])
    if on_gpus and opts.gpus_per_node is None:
        raise UserError(f"the plan prices {req['nproc']} GPU(s) a node: give --gpus-per-node {req['nproc']} (or more)")
    if opts.gpus_per_node is not None and req["nproc"] > opts.gpus_per_node:
        raise UserError(f"--gpus-per-node {opts.gpus_per_node}: the plan runs {req['nproc']} processes a node, one per "
                        f"GPU: give --gpus-per-node {req['nproc']}")


def submit_validation(root: str | Path, top: int | None, repeats: int, steps: int | None, opts: SlurmOptions,
                      workdir: Path, dry_run: bool) -> PlanSubmission:
    """Check everything, then (unless a dry run) write a script per run and submit them round by round. `top`: how
    many of the plan's first (0: all; None: those its model cannot tell from the chosen one, plan/certainty.py)."""
    from scaletrain.plan.measure import run_dir
    from scaletrain.rundir import PLAN, write_json_atomic

    root = Path(root).resolve()
    plan = read_plan(root)
    check_cluster(opts, dry_run)
    check_nodes(plan, opts)
    if not plan.get("chosen"):
        raise UserError(f"{root / PLAN} chose no candidate (none fits or none was priced): nothing to validate")
    if repeats < 1 or (steps is not None and steps < 1):
        raise UserError(f"--repeats {repeats} / --validate-steps {steps}: give at least 1 of each")
    if top is None:
        from scaletrain.plan.certainty import uncertain

        top = uncertain(plan["ranked"], plan["basis"])["count"]
    ranked = plan["ranked"][:top or len(plan["ranked"])]
    planned = []
    for k in range(repeats):  # round by round: the queue starts each round's candidates before the next round's
        for c in ranked:
            run = run_dir(root, c["rank"], k)
            if run.exists():
                raise UserError(f"{run} exists: a validation of this plan ran before; plan again into a new --out")
            script = jobs.slurm_dir(root) / f"c{c['rank']}-r{k}.sbatch"
            planned.append(RunJob(c["rank"], k, run, script, render(_batch_job(root, c, k, steps, opts, workdir))))
    if dry_run:
        return PlanSubmission(root, len(ranked), repeats, steps, planned)
    jobs.refuse_if_queued(root, "plan validation")
    plan[JOBS_KEY] = {"executor": "slurm", "top": len(ranked), "repeats": repeats, "steps": steps}
    write_json_atomic(root / PLAN, plan)
    jobs.slurm_dir(root).mkdir(parents=True, exist_ok=True)
    for rj in planned:
        rj.run.parent.mkdir(parents=True, exist_ok=True)  # (the job's output goes beside its run)
        rj.script.write_text(rj.script_text)
    submitted: list[RunJob] = []
    try:
        for rj in planned:
            job_id = submit.sbatch(rj.script)
            submitted.append(replace(rj, job=jobs.Job(job_id=job_id, script=str(rj.script),
                                                      output=str(rj.run.with_suffix(".log")), run=str(rj.run),
                                                      submitted_at=jobs.now())))
    finally:  # what was submitted is recorded even when a later sbatch fails
        jobs.record_jobs(root, [rj.job for rj in submitted if rj.job is not None])
    return PlanSubmission(root, len(ranked), repeats, steps, submitted)


def _batch_job(root: Path, c: dict[str, Any], k: int, steps: int | None, opts: SlurmOptions, workdir: Path) -> BatchJob:
    """`scaletrain train --plan DIR --plan-rank R` cut to a brief run (plan/measure.brief_flags), as `plan
    --validate` runs it here; the gatherer after it."""
    from scaletrain.plan.measure import brief_flags, run_dir

    run = run_dir(root, c["rank"], k)
    gather_cmd = [sys.executable, "-m", "scaletrain", "slurm", "gather", str(root)]
    return BatchJob(options=opts, job_name=opts.job_name or f"scaletrain-{root.name}-c{c['rank']}-r{k}", run=run,
                    train=[sys.executable, "-m", "scaletrain", "train", "--plan", str(root), "--plan-rank",
                           str(c["rank"]), *brief_flags(c, steps)],
                    output=str(run.with_suffix(".log")), workdir=workdir.resolve(), after=[gather_cmd],
                    title=f"scaletrain plan {root}: candidate #{c['rank']}, round {k + 1}")


def gather(root: str | Path) -> dict[str, int]:
    """Compare the runs completed so far with the plan: plan.json's `validation` (with how many are still pending)
    and the report rewritten. Every run's job runs this when its training step ends. Returns the runs by status."""
    import contextlib

    from scaletrain.plan.agreement import compare
    from scaletrain.plan.measure import collected, run_dir
    from scaletrain.plan.present import write_report
    from scaletrain.rundir import PLAN, read_summary, write_json_atomic
    from scaletrain.study.runner import error_line, run_state

    root = Path(root).resolve()
    with jobs.locked(root):
        plan = read_plan(root)
        sent = plan.get(JOBS_KEY)
        if not sent:
            raise UserError(f"{root / PLAN} records no validation jobs: submit them with `scaletrain slurm "
                            "validate-plan`")
        top = plan["ranked"][:sent["top"]]
        counts = {"completed": 0, "failed": 0, "pending": 0}
        failed = []
        for k in range(sent["repeats"]):
            for c in top:
                run = run_dir(root, c["rank"], k)
                log = run.with_suffix(".log")
                text = log.read_text(errors="replace") if log.is_file() else ""
                state = run_state(run)
                ended = re.findall(r"scaletrain: train exited with (\d+)", text)  # (the script's own line)
                if state not in ("completed", "failed") and ended and int(ended[-1]) not in (0, PREEMPTED):
                    state = "failed"  # refused or killed before it wrote a summary
                if state in ("completed", "failed"):
                    counts[state] += 1
                else:
                    counts["pending"] += 1
                if state == "failed":
                    why = error_line(text, read_summary(run, strict=False), int(ended[-1]) if ended else 1)
                    failed.append(f"#{c['rank']} round {k + 1}: {why} (log {log.relative_to(root)})")
        runs = {cid: found for cid, found in collected(root, plan).items() if cid in {c["id"] for c in top}}
        if counts["completed"]:
            plan["validation"] = {**compare(top, runs), "repeats": sent["repeats"], "steps": sent["steps"],
                                  "failed": failed, "pending": counts["pending"]}
            write_json_atomic(root / PLAN, plan)
            with contextlib.suppress(UserError):  # the report is a view; plan.json is what matters
                write_report(plan, root)
    return counts


__all__ = ["PlanSubmission", "RunJob", "submit_validation", "gather", "check_nodes", "JOBS_KEY"]
