"""`scaletrain validate PREDICTION RUN_OR_STUDY...`: arguments, the terminal table, where the files went."""

from __future__ import annotations

import argparse
from pathlib import Path

from scaletrain.command import Command
from scaletrain.console.width import output_console
from scaletrain.errors import UserError
from scaletrain.grid import rich_table
from scaletrain.rundir import check_out
from scaletrain.validate.load import load_measured, load_prediction, prediction_path
from scaletrain.validate.match import describe_unmatched, summary_line, validate
from scaletrain.validate.output import prepare, ratio_line, ratio_table, table, write_validation


def add_validate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("prediction", help="prediction.json of `scaletrain predict`, or the directory holding it")
    p.add_argument("measured", nargs="+", metavar="RUN_OR_STUDY",
                   help="run directories (scaletrain train --out) and study directories (scaletrain study --out)")
    p.add_argument("--out", metavar="DIR", help="where validation.json and plots/ go (default: a validation/ "
                                                "folder beside the prediction)")
    p.description = ("Compare a prediction with measured runs: each run (each completed repeat of a study) is "
                     "matched to the predicted point of its configuration, and step time, phases, samples/s and "
                     "peak memory are compared (docs/validate.md).")


def run_validate(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else prediction_path(args.prediction).parent / "validation"
    check_out(out, "validation")
    prediction = load_prediction(args.prediction)
    notes: list[str] = []
    runs = load_measured([Path(m) for m in args.measured], notes)
    result = validate(prediction, runs)
    if not result["points"]:
        first = describe_unmatched(result["unmatched"][0]) if result["unmatched"] else "no runs"
        raise UserError(f"none of the {len(runs)} measured run(s) matches a point of the prediction ({first}): "
                        "give runs of the predicted configurations, or predict the ones that ran")
    prepare(out)
    console = output_console()
    say = lambda line: console.print(line, soft_wrap=True, highlight=False, markup=False)  # noqa: E731
    if prediction.get("basis_note"):
        say(f"prediction basis: {prediction.get('basis') or 'unknown'}: {prediction['basis_note']}")
    for note in notes + result["notes"]:
        say(f"note: {note}")
    console.print(rich_table(table(result)))
    ratios = ratio_table(result)
    if ratios is not None:
        console.print(rich_table(ratios))
    for u in result["unmatched"]:
        say(f"unmatched: {describe_unmatched(u)}")
    if result["unmeasured_points"]:
        say(f"not measured: {len(result['unmeasured_points'])} predicted point(s) had no run "
            f"({', '.join(result['unmeasured_points'])})")
    written, plot_notes = write_validation(result, out)
    for note in plot_notes:
        say(f"note: {note}")
    say(summary_line(result["summary"]))
    if ratio_line(result):
        say(ratio_line(result))
    say(f"validation: {written[0]}" + (f" (plots in {written[0].parent / 'plots'})" if len(written) > 1 else ""))
    return 0


COMMANDS = (
    Command("validate", "compare a prediction with measured runs or studies",
            add_validate_args, run_validate),
)
