"""What a validation leaves behind: the table (a Grid, for the terminal), validation.json and the plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaletrain.errors import UserError
from scaletrain import fmt
from scaletrain.report.output import check_report_dir, writing
from scaletrain.report.series import PHASE_LABELS
from scaletrain.grid import Grid
from scaletrain.rundir import VALIDATION, write_json_atomic
from scaletrain.validate.match import largest_phase_error

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
    g = Grid(f"prediction ({basis}) against measurement", ["point", "runs", "measured", "spread", "predicted",
                                                            "error", "largest phase error"], text_columns=(0, 6))
    for p in result["points"]:
        spread = p["measured"].get("spread")
        g.rows.append([p["id"], str(len(p["run_dirs"])), fmt.duration(p["measured"]["step_time_s"]),
                       fmt.share(spread, 1) if spread is not None else fmt.DASH,
                       fmt.duration(p["predicted"]["step_time_s"]), fmt.change(p["errors"]["step_time"]),
                       _phase_cell(p["errors"])])
    g.note = ("step time per step (steady-state mean over the runs); spread = (max - min) / mean of the runs' step "
              "times (the machine's own noise at that point); error = (predicted - measured) / measured; largest "
              "phase error = the phase predicted furthest off in time")
    return g


def ratio_table(result: dict[str, Any]) -> Grid | None:
    """One row per ratio measured side by side (validate/ratios.py), None when the points allow none."""
    rows = result.get("ratios") or []
    if not rows:
        return None
    g = Grid("ratios measured side by side: throughput of one point over another that differs in one setting",
             ["varies", "from", "to", "measured", "predicted", "error", "spread", "noise"], text_columns=(0, 1, 2))
    for r in rows:
        se = r.get("standard_error")
        g.rows.append([r["axis"], f"{r['from_value']} ({r['from']})", f"{r['to_value']} ({r['to']})",
                       f"{r['measured']:.3f}x", f"{r['predicted']:.3f}x", fmt.change(r["error"]),
                       fmt.share(r["spread"], 1) if r["spread"] is not None else fmt.DASH,
                       fmt.share(se, 1) if se is not None else fmt.DASH])
    g.note = ("a ratio cancels the machine's drift between runs made minutes apart; error = predicted / measured - 1; "
              "spread = (max - min) / mean of the rounds' ratios (without rounds: the two points' repeat spreads "
              "combined); noise = the standard error of the rounds' mean ratio")
    return g


def ratio_line(result: dict[str, Any]) -> str | None:
    """`ratios: median |error| 3.1%, p90 8.0% over 6 ratios; 3 over, 3 under; ...`, None without ratios."""
    from scaletrain.validate.match import sign_words

    s = result.get("ratio_summary") or {}
    if not s.get("count"):
        return None
    line = (f"ratios: median |error| {100 * s['median_abs_error']:.1f}%, p90 {100 * s['p90_abs_error']:.1f}% over "
            f"{s['count']} ratio{'s' if s['count'] != 1 else ''}" + sign_words(s))
    if s.get("noise_median_abs_error") is not None:
        line += (f"; {s['beyond_noise']} of {s['with_noise']} beyond the rounds' noise, which alone would show "
                 f"median {100 * s['noise_median_abs_error']:.1f}%, p90 {100 * s['noise_p90_abs_error']:.1f}%")
    return line


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
    from scaletrain.validate import plots  # (matplotlib: 1 s that every command's start would pay)

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


__all__ = ["VALIDATION", "PLOTS", "table", "ratio_table", "ratio_line", "prepare", "write_validation"]
