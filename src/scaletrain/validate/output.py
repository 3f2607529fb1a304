"""What a validation leaves behind: the table (a Grid, for the terminal), validation.json and the plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaletrain.errors import UserError
from scaletrain.report import fmt
from scaletrain.report.output import check_report_dir, writing
from scaletrain.report.series import PHASE_LABELS
from scaletrain.report.tables import Grid
from scaletrain.rundir import write_json_atomic
from scaletrain.validate import plots
from scaletrain.validate.match import largest_phase_error

VALIDATION = "validation.json"
PLOTS = "plots"


def _phase_cell(errors: dict[str, Any]) -> str:
    largest = largest_phase_error(errors)
    if largest is None:
        return "no phases to compare"
    name, e = largest
    rel = fmt.change(e["relative"]) if e["relative"] is not None else "under 2% of the step"
    sign = "-" if e["difference_s"] < 0 else "+"
    return f"{PHASE_LABELS.get(name, name)} {rel} ({sign}{fmt.duration(abs(e['difference_s']))})"


def table(result: dict[str, Any]) -> Grid:
    """One row per matched point: measured and predicted step time, the error, the phase missed by the most."""
    basis = result.get("basis") or "unknown basis"
    g = Grid(f"prediction ({basis}) against measurement", ["point", "runs", "measured", "predicted", "error",
                                                            "largest phase error"], text_columns=(0, 5))
    for p in result["points"]:
        g.rows.append([p["id"], str(len(p["run_dirs"])), fmt.duration(p["measured"]["step_time_s"]),
                       fmt.duration(p["predicted"]["step_time_s"]), fmt.change(p["errors"]["step_time"]),
                       _phase_cell(p["errors"])])
    g.note = ("step time per step (steady-state mean over the runs); error = (predicted - measured) / measured; "
              "largest phase error = the phase predicted furthest off in time")
    return g


def prepare(out: Path) -> Path:
    """The output folder, created, with validation.json and plots/ writable in it (else one UserError line)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder: choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {out} ({e.strerror or e}): choose another --out") from None
    check_report_dir(out, VALIDATION, PLOTS)
    return out


def write_validation(result: dict[str, Any], out: Path) -> tuple[list[Path], list[str]]:
    """validation.json and the plots in `out` (prepared); returns the files written and what was not drawn."""
    with writing(out / VALIDATION):
        write_json_atomic(out / VALIDATION, result)
        written, notes = [out / VALIDATION], []
        if result["points"]:
            written.append(plots.step_time_scatter(result["points"], out / PLOTS / "step-time.png",
                                                   "predicted against measured step time"))
        else:
            notes.append("step-time plot: not drawn, no run matched a predicted point")
        if any(s["count"] for s in result["phase_summary"].values()):
            written.append(plots.phase_errors(result["phase_summary"], out / PLOTS / "phase-errors.png"))
        else:
            notes.append("phase-error plot: not drawn, no phase above 2% of a step was both measured and predicted")
    return written, notes


__all__ = ["VALIDATION", "PLOTS", "table", "prepare", "write_validation"]
