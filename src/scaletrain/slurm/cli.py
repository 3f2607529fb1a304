"""`scaletrain slurm train|study|gather`: the flags of train and study plus SLURM's; write and submit the jobs."""

from __future__ import annotations

import argparse
from pathlib import Path

from scaletrain.command import Command
from scaletrain.slurm.options import SLURM_FLAGS, add_options, options_from_args

EXAMPLE = ("examples:\n"
           "  scaletrain slurm train --nodes 2 --gpus-per-node 4 --partition gpu --time 2:00:00 \\\n"
           "      --model resnet50 --dataset imagefolder:/data/imagenet --epochs 90 --out runs/r50\n"
           "  scaletrain slurm study --nodes 1 --time 30 --nproc 1,2 --model lenet5 --dataset digits "
           "--epochs 2 --out runs/study\n"
           "  scaletrain slurm train --dry-run --model lenet5 --dataset digits --out runs/x   (print the script)")


def add_slurm_args(p: argparse.ArgumentParser) -> None:
    from scaletrain.config.flags import add_train_args
    from scaletrain.study.cli import add_study_args

    p.description = ("Write a batch script for a train or study command (the same flags, plus SLURM's) and "
                     "submit it with sbatch. One launch agent per node; the job checkpoints on SLURM's warning "
                     "before its time limit and requeues itself, and every start resumes from the checkpoint.")
    p.epilog = EXAMPLE
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = p.add_subparsers(dest="slurm_command", required=True, metavar="{train,study,validate-plan,gather}")
    train = sub.add_parser("train", help="one training run as one job (train's flags plus SLURM's)",
                           description="scaletrain train as a SLURM job: RUN/slurm/job.sbatch, its output "
                                       "RUN/slurm/job-<id>.out")
    add_options(train)
    add_train_args(train)
    study = sub.add_parser("study", help="a study as one job per point and repeat (study's flags plus SLURM's)",
                           description="scaletrain study as SLURM jobs: one per point and repeat, run directories "
                                       "and logs where the study puts them; study.json rewritten as each ends")
    add_options(study, dry_run=False)  # study's own --dry-run: print what would be submitted
    add_study_args(study)
    plan = sub.add_parser("validate-plan", help="plan --validate's brief runs as jobs on the plan's nodes, one per "
                                                "candidate and round",
                          description="scaletrain plan --validate on SLURM: the top candidates of the plan in DIR "
                                      "run briefly as `train --plan DIR --plan-rank K` jobs on --nodes (the plan's), "
                                      "round by round; each job ends by comparing the runs done so far with the "
                                      "plan (plan.json `validation`, the report)")
    add_options(plan)
    plan.add_argument("plan", metavar="DIR", help="the plan's directory (--out of scaletrain plan)")
    plan.add_argument("--top", default="3", metavar="K|auto|all",
                      help="candidates to run, from the plan's first (auto: those priced within the model's own error "
                           "of the chosen one, docs/plan.md \"How sure\"; default 3)")
    plan.add_argument("--repeats", type=int, default=None, help="rounds, each running every candidate once "
                                                                "(default 3)")
    plan.add_argument("--validate-steps", type=int, default=None, help="training steps of each brief run "
                                                                       "(default: about 2 s of its predicted steps, "
                                                                       "at least 30)")
    gather = sub.add_parser("gather", help="rewrite a SLURM study's study.json, or a plan's validation, from its run "
                                           "directories (each job does this when it ends)")
    gather.add_argument("study", help="the study directory (--out of scaletrain slurm study), or the plan's "
                                      "(scaletrain slurm validate-plan DIR)")
    p.commands = sub.choices


def run_slurm(args: argparse.Namespace) -> int:
    from rich.console import Console

    from scaletrain.slurm import view

    console = Console(highlight=False, soft_wrap=True)  # paths and commands whole, to copy
    if args.slurm_command == "gather":
        from scaletrain.rundir import PLAN

        if (Path(args.study) / PLAN).is_file():
            from scaletrain.slurm.plan_jobs import gather as gather_plan

            counts = gather_plan(args.study)
            console.print(f"the validation in {Path(args.study) / PLAN}: "
                          + ", ".join(f"{n} {s}" for s, n in counts.items()))
            return 0
        from scaletrain.slurm.study_jobs import gather

        counts = gather(args.study)
        console.print(f"study.json of {args.study}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        return 0
    opts = options_from_args(args)
    if args.slurm_command == "validate-plan":
        from scaletrain.plan.measure import REPEATS
        from scaletrain.slurm.plan_jobs import submit_validation

        top = {"all": 0, "auto": None}[args.top] if args.top in ("all", "auto") else _count(args.top, "--top")
        sub = submit_validation(args.plan, top, args.repeats or REPEATS, args.validate_steps, opts,
                                Path.cwd(), args.dry_run)
        view.print_plan_validation(console, sub, opts, args.dry_run)
        return 0
    if args.slurm_command == "train":
        from scaletrain.config import field_names
        from scaletrain.slurm.train_job import submit_train

        known = set(field_names())
        given = {k: v for k, v in vars(args).items() if k in known and k not in SLURM_FLAGS}
        sub = submit_train(given, args.config, opts, Path.cwd(), args.dry_run)
        view.print_train(console, sub, opts)
        return 0
    from scaletrain.slurm.study_jobs import submit_study

    sub = submit_study(args, opts, Path.cwd())
    view.print_study(console, sub, opts, args.dry_run)
    return 0


def _count(text: str, flag: str) -> int:
    from scaletrain.errors import UserError

    try:
        k = int(text)
    except ValueError:
        k = 0
    if k < 1:
        raise UserError(f"{flag} {text!r}: give how many of the plan's top candidates to run, at least 1 (or all)")
    return k


__all__ = ["add_slurm_args", "run_slurm"]


COMMANDS = (
    Command("slurm", "write and submit an sbatch job of a train or study command (requeued "
            "on preemption)",
            add_slurm_args, run_slurm),
)
