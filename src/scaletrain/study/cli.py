"""`scaletrain study`: arguments, and the loop that runs every point, records study.json and prints the results."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

from scaletrain.command import Command
from scaletrain.errors import UserError
from scaletrain.study.grid import (AXES, STUDY_OWNED, StudySpec, Threads, fair_threads, given_settings,
                                   load_spec_file, parse_axis,
                                   points, resolve_spec, validate_points)
from scaletrain.study.results import failed_points, study_entries
from scaletrain.distributed.env import child_env
from scaletrain.rundir import StudyDir
from scaletrain.study.runner import (PlannedRun, check_study_dir, initial_record, prepare_run, recorded_spec,
                                     run_point, run_state, terminate_as_interrupt, write_results, write_spec)

EXAMPLE = ("example: scaletrain study --nproc 1,2 --workers 0,2 --model resnet20 --dataset digits "
           "--epochs 1 --out runs/study")


def add_study_args(p: argparse.ArgumentParser) -> None:
    from scaletrain.config.flags import add_config_flags

    p.description = ("Run every combination of the axis values (comma lists) as its own training launch, "
                     "each with the fixed train settings; resumable by rerunning the same command.")
    p.epilog = EXAMPLE
    p.add_argument("--out", required=True, help="study directory (points/<id>/r<k>/, study.toml, study.json)")
    p.add_argument("--config", help="study TOML with [axes] (lists), [train] (fixed settings) and repeats; "
                                     "flags override it")
    p.add_argument("--repeats", type=int, default=None, help="runs of each point, to measure noise (default: 1)")
    p.add_argument("--dry-run", action="store_true", help="list the points and what is already done; launch nothing")
    p.add_argument("--predict", action="store_true", help="predict every point first (OUT/prediction/), run the "
                                                           "study, then validate the prediction (OUT/validation/)")
    p.add_argument("--calibration", help="with --predict: the calibration file (default: this machine's)")
    add_config_flags(p, lists=tuple(AXES), skip=tuple(STUDY_OWNED))


def spec_from_args(args: argparse.Namespace) -> StudySpec:
    """The study file (if any) < flags: comma lists for the axes, single values for the other train settings."""
    if getattr(args, "calibration", None) and not getattr(args, "predict", False):
        raise UserError("--calibration applies only with --predict (the calibration the prediction uses): add "
                        "--predict, or drop --calibration")
    file_spec = load_spec_file(args.config) if args.config else None
    given = vars(args)
    axes = {name: parse_axis(name, given[name]) for name in AXES if name in given}
    train = given_settings(given, AXES)
    return resolve_spec(file_spec, axes, train, args.repeats)


def run_study(args: argparse.Namespace, spec: StudySpec | None = None) -> int:
    """`spec`: the grid already made from settings (scaletrain.api); else from the flags in `args`."""
    from scaletrain.console.width import output_console
    from scaletrain.distributed.device import machine_cores
    from scaletrain.distributed.launch.preflight import validate
    from scaletrain.study.view import threads_line

    spec = spec if spec is not None else spec_from_args(args)
    study = StudyDir(args.out)
    # one --threads for every point unless given (or recorded): the speedups then compare processes alone
    spec, threads = fair_threads(spec, machine_cores(), recorded_spec(study))
    grid = points(spec)  # every point's config is checked here, before anything is launched
    resuming = check_study_dir(study, spec)
    # and every point still to run against its model, data and launch shape: a bad point found after
    # hours of good ones is a wasted night (nothing is written by this)
    validate_points([p for p in grid if any(run_state(study.run(p.id, k)) != "completed"
                                            for k in range(spec.repeats))], validate)
    console = output_console(highlight=False)
    if args.dry_run:
        return _dry_run(console, study, spec, grid, threads)
    # --predict reads its calibration (and may refuse it) before the study writes anything
    prediction = _predict(spec, args) if getattr(args, "predict", False) else None
    write_spec(study, spec)
    if prediction is not None:
        _write_prediction(console, study, prediction)
    runs = {p.id: [initial_record(study, p.id, k) for k in range(spec.repeats)] for p in grid}
    write_results(study, study_entries(grid, runs))
    total = len(grid) * spec.repeats
    done = sum(r["status"] == "completed" for rs in runs.values() for r in rs)
    console.print(f"study {study.root}: {_runs_text(len(grid), spec.repeats)}"
                  + (f", {done} already done (resuming)" if resuming else ""))
    console.print(threads_line(threads))
    try:
        with terminate_as_interrupt():
            _run_all(console, study, spec, grid, runs)
            code = _finish(console, study, spec, grid, runs, threads)
            if getattr(args, "predict", False):
                _validate(console, study)
            return code
    except KeyboardInterrupt:
        write_results(study, study_entries(grid, runs))
        finished = sum(r["status"] != "pending" for rs in runs.values() for r in rs)
        print(f"interrupted after {finished} of {total} runs (study.json has them): "
              "rerun the same command to resume", file=sys.stderr)
        return 130


def _run_all(console, study: StudyDir, spec: StudySpec, grid: list, runs: dict[str, list[dict[str, Any]]]) -> None:
    """Launch every point repeat that is not completed yet, one at a time, recording study.json after each."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from scaletrain.study.view import axes_text, run_label, run_line

    env = child_env()
    total = len(grid) * spec.repeats
    # two lines: the whole study (bar over runs, total time) and the current run (its point, elapsed)
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.fields[count]}"), TimeElapsedColumn(), console=console, transient=True)
    with progress:
        overall = progress.add_task("study", total=total, count=f"0/{total} runs")
        passed = 0
        # interleaved: every point's first repeat, then every point's second, ... so that a drift of the
        # machine's speed during the study falls on every point alike instead of on the last points
        for k in range(spec.repeats):
            for i, point in enumerate(grid, 1):
                label = run_label(point.id, k, spec.repeats)
                if runs[point.id][k]["status"] == "completed":
                    console.print(f"[dim]skipped {label}: already completed[/]")
                    passed += 1
                    progress.update(overall, completed=passed, count=f"{passed}/{total} runs")
                    continue
                run = study.run(point.id, k)
                state = run_state(run)
                if state != "new":  # train refuses an --out that holds a run: start this one afresh
                    console.print(f"{label}: removing {'an' if state == 'unfinished' else 'a'} {state} earlier run "
                                  "and starting it again")
                prepare_run(study, PlannedRun(point, k, state), resume=False)
                repeat = f"  repeat {k + 1}/{spec.repeats}" if spec.repeats > 1 else ""
                what = f"point {i}/{len(grid)}  {axes_text(point.axes)}{repeat}"
                current = progress.add_task(what, total=None, count="")
                start = time.monotonic()
                log = study.relative(study.log(point.id, k))
                waiting = None if console.is_terminal else _follow(console, what, run, log)  # a log: lines
                record = run_point(study, point, k, env, waiting)
                progress.remove_task(current)
                runs[point.id][k] = record
                write_results(study, study_entries(grid, runs))
                passed += 1
                progress.update(overall, completed=passed, count=f"{passed}/{total} runs")
                console.print(run_line(point.id, k, spec.repeats, record, time.monotonic() - start, log))


def _follow(console, what: str, run: Path, log: str) -> Callable[[], None]:
    """A study in a log (no bar to see): the run's progress, read from its run directory as `scaletrain watch`
    reads it, as a line when it starts and then at console/pace.py's pace while it goes."""
    from scaletrain.console.pace import Pace
    from scaletrain.rundir import RunDir
    from scaletrain.study.view import running_line
    from scaletrain.watch.reader import RunReader

    reader, pace, polls = RunReader(RunDir(run)), Pace(), 0

    def waiting() -> None:
        nonlocal polls
        polls += 1
        if pace.due(polls):
            console.print(running_line(what, reader.snapshot(), log), markup=False, soft_wrap=True)

    return waiting


def _finish(console, study: StudyDir, spec: StudySpec, grid: list, runs: dict[str, list[dict[str, Any]]],
            threads: Threads) -> int:
    from scaletrain.report import write_study_report
    from scaletrain.grid import rich_table
    from scaletrain.study.view import flag_lines, results_table, threads_line

    entries = study_entries(grid, runs)
    write_results(study, entries)
    # columns for the axes that vary (and nproc, the scaling axis); the fixed ones go in the caption
    shown = [a for a, values in spec.axes.items() if a == "nproc" or len(values) > 1]
    fixed = ", ".join(f"{a}={values[0]}" for a, values in spec.axes.items() if a not in shown)
    console.print(rich_table(results_table(entries, shown, f"study {study.root}", fixed or None)))
    console.print(threads_line(threads))
    for line in flag_lines(entries):
        console.print(line)
    console.print(f"study.json: {study.results}")
    try:
        console.print(f"report: {write_study_report(study.root)}")
    except UserError as e:  # e.g. nothing completed to plot: the failures below matter more
        console.print(f"no report: {e}")
    failed = failed_points(entries)
    if failed:
        names = "; ".join(f"{e['id']} ({e['error']})" for e in failed)
        print(f"error: {len(failed)} of {len(entries)} points failed: {names}. Logs are in "
              f"{study.root / 'points'}/<point>/r<k>.log; rerun the same command to retry them", file=sys.stderr)
        return 1
    return 0


def _predict(spec: StudySpec, args: argparse.Namespace) -> dict[str, Any]:
    """--predict: the study's points predicted before anything runs (the same axes and settings)."""
    from scaletrain.console.phase import phase
    from scaletrain.predict.cli import load_basis, network_from, speed_probe
    from scaletrain.predict.scaling import predict_grid
    from scaletrain.predict.shapes import for_calibration

    args.hardware, args.network, args.link, args.latency = None, None, None, None
    cal, hw, basis = load_basis(args)
    with phase("predict: tracing the model and pricing each point", eta=False) as update:
        return predict_grid(spec, cal, network_from(args, cal, hw), hw, basis, probe=speed_probe(cal, hw, "off"),
                            progress=update, shapes=for_calibration(cal if hw is None else None, "auto"))


def _write_prediction(console, study: StudyDir, prediction: dict[str, Any]) -> None:
    from scaletrain.predict.report import write_prediction_report
    from scaletrain.rundir import PREDICTION, write_json_atomic

    out = study.root / "prediction"
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / PREDICTION, prediction)
    console.print(f"prediction: {out / PREDICTION} ({len(prediction['points'])} points; "
                  f"report {write_prediction_report(prediction, out)})")


def _validate(console, study: StudyDir) -> None:
    """--predict: the prediction against what the study measured."""
    from scaletrain.validate import load_measured, load_prediction, validate
    from scaletrain.validate.match import summary_line
    from scaletrain.rundir import VALIDATION
    from scaletrain.validate.output import prepare, ratio_line, write_validation

    notes: list[str] = []
    result = validate(load_prediction(study.root / "prediction"), load_measured([study.root], notes))
    out = prepare(study.root / "validation")
    write_validation(result, out)
    console.print(f"validation: {out / VALIDATION}: {summary_line(result['summary'])}")
    if ratio_line(result):
        console.print(ratio_line(result))


def _runs_text(n_points: int, repeats: int) -> str:
    """Like `3 points x 2 repeats = 6 runs`."""
    def plural(n: int, word: str) -> str:
        return f"{n} {word}{'s' * (n != 1)}"

    return f"{plural(n_points, 'point')} x {plural(repeats, 'repeat')} = {plural(n_points * repeats, 'run')}"


def _dry_run(console, study: StudyDir, spec: StudySpec, grid: list, threads: Threads) -> int:
    from scaletrain.grid import rich_table
    from scaletrain.study.view import plan_table, threads_line

    states = {p.id: [run_state(study.run(p.id, k)) for k in range(spec.repeats)] for p in grid}
    done = sum(s == "completed" for ss in states.values() for s in ss)
    total = len(grid) * spec.repeats
    console.print(rich_table(plan_table(grid, states, spec.repeats, f"study {study.root} (dry run)")))
    console.print(threads_line(threads))
    console.print(f"{_runs_text(len(grid), spec.repeats)}: {done} done, {total - done} to run; nothing launched")
    return 0


__all__ = ["add_study_args", "spec_from_args", "run_study"]


COMMANDS = (
    Command("study", "run a grid of training launches and report their scaling",
            add_study_args, run_study),
)
