"""`scaletrain report` and `scaletrain compare`: arguments, terminal tables, and where the HTML went."""

from __future__ import annotations

import argparse
from pathlib import Path

from scaletrain.command import Command
from scaletrain.console.width import output_console
from scaletrain.errors import UserError
from scaletrain.grid import rich_table
from scaletrain.report import compare, tables
from scaletrain.report.load import Run, kind_of, load, overview
from scaletrain.report.output import check_page_path, check_report_dir


def add_report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="a run directory (scaletrain train --out), a study directory (scaletrain study --out) "
                               "or a plan (scaletrain plan --out)")
    p.description = ("Rebuild DIR/report.html and DIR/plots/ from the directory's files (nothing is rerun; no "
                     "other file is changed) and print the main tables.")


def run_report(args: argparse.Namespace) -> int:
    from scaletrain.report import build  # (matplotlib: 1 s that every other command's start would pay)

    console = output_console()
    if kind_of(args.dir) == "plan":
        return _report_plan(args.dir, console)
    target = load(args.dir)
    check_report_dir(target.root, build.REPORT, build.PLOTS)  # before any table is printed
    if isinstance(target, Run):
        grids = build.run_grids(target)
        for grid in grids:
            console.print(rich_table(grid))
        for note in target.notes:
            console.print(f"note: {note}")
        path = build.render_run(target)
    else:
        points, flags, _, diagnosis = build.study_grids(target)
        console.print(rich_table(points))
        for *_, message in flags.rows:  # whole lines, so that they read (and grep) as one sentence each
            console.print(f"warning: {message}", soft_wrap=True, highlight=False, markup=False)
        console.print(rich_table(diagnosis))
        path = build.render_study(target)
    console.print(f"report: {path}", soft_wrap=True, highlight=False)
    return 0


def _report_plan(folder: str, console) -> int:
    """A plan's report rebuilt from its plan.json (scaletrain plan: docs/plan.md)."""
    from scaletrain.plan.present import read_plan, skipped_grid, top_grid, write_report

    root = Path(folder)
    plan = read_plan(root)
    console.print(rich_table(top_grid(plan)))
    console.print(rich_table(skipped_grid(plan)))
    console.print(f"report: {write_report(plan, root)}", soft_wrap=True, highlight=False)
    return 0


def add_compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="run or study directory A (the reference)")
    p.add_argument("b", help="run or study directory B, of the same kind as A")
    p.add_argument("--html", metavar="FILE", help="also write the comparison as a self-contained HTML page")
    p.description = "Put two runs (phase by phase) or two studies (point by point) side by side."


def run_compare(args: argparse.Namespace) -> int:
    from scaletrain.report import build

    if args.html:
        check_page_path(args.html, "--html")  # before anything is read or drawn
    kind_a, kind_b = kind_of(args.a), kind_of(args.b)
    if "plan" in (kind_a, kind_b):
        raise UserError("compare puts two runs or two studies side by side; a plan ranks its candidates itself: "
                        "scaletrain report PLAN_DIR shows them")
    if kind_a != kind_b:
        raise UserError(f"cannot compare a {kind_a} ({args.a}) with a {kind_b} ({args.b}): "
                        "give two run directories or two study directories")
    a, b = load(args.a), load(args.b)
    if isinstance(a, Run) and isinstance(b, Run):
        settings = (compare.run_settings(a.config, a.summary), compare.run_settings(b.config, b.summary))
        cmp = compare.compare_runs(overview(a), overview(b), settings)
        grid = tables.compare_runs(cmp)
    else:
        axes = a.axes + [x for x in b.axes if x not in a.axes]
        settings = (compare.study_settings(a.points, a.spec), compare.study_settings(b.points, b.spec))
        cmp = compare.compare_studies(a.points, b.points, axes, settings)
        grid = tables.compare_studies(cmp)
    console = output_console()
    console.print(rich_table(tables.compare_config(cmp)))  # what was asked differently, then what differs
    console.print(rich_table(grid))
    console.print(cmp["verdict"], soft_wrap=True, highlight=False)
    if args.html:
        path = build.render_compare(cmp, a, b, args.html)
        console.print(f"comparison: {path}", soft_wrap=True, highlight=False)
    return 0


COMMANDS = (
    Command("report", "rebuild the report of a run or study from its files",
            add_report_args, run_report),
    Command("compare", "put two runs or studies side by side",
            add_compare_args, run_compare),
)
