"""What each correction of the calibration basis is worth (docs/predict.md, "What each correction is worth").

Predicts recorded studies from one calibration with every correction (predictor.CORRECTIONS), then with each
one left out in turn, and validates each prediction against the studies' runs (predict/ablation.py): the
step-time and ratio errors, and the error of the phases the correction prices, with and without it, side by
side. No training runs: about 10 s per study.

    python benchmarks/corrections.py CALIBRATION STUDY [STUDY ...] [--json FILE]

A correction whose removal leaves every error where it was is not earning its place (or the studies do not
exercise it: the table says which studies it changed nothing in).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from scaletrain.predict.ablation import ablation


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def table(rows: list[dict[str, Any]], title: str, study: str | None = None):
    """The rows as a Grid (over every study, or over `study`'s points): errors with each correction left out,
    the change against every correction on, and the error of the phases the correction prices."""
    from scaletrain.grid import Grid

    def of(r: dict[str, Any]) -> dict[str, Any]:
        return r if study is None else r["studies"][study]

    base = rows[0]
    grid = Grid(title, ["left out", "step median", "ratio median", "ratio p90", "over/under", "Δ ratio median",
                        "its phases", "their error with → without", "inert in"])
    for r in rows:
        inert = [Path(s).name for s, v in r["studies"].items() if (study is None or s == study)
                 and all(abs(a - b) <= 1e-9 * max(1e-12, b) for a, b in
                         zip(v["predicted_s"], base["studies"][s]["predicted_s"]))]
        same = r is base
        grid.rows.append([
            r["without"] or "(nothing)", _pct(of(r)["step"]["median_abs_error"]),
            _pct(of(r)["ratios"].get("median_abs_error")), _pct(of(r)["ratios"].get("p90_abs_error")),
            f"{of(r)['ratios'].get('over', 0)}/{of(r)['ratios'].get('under', 0)}",
            "" if same or of(r)["ratios"].get("median_abs_error") is None else
            f"{100 * (of(r)['ratios']['median_abs_error'] - of(base)['ratios']['median_abs_error']):+.1f}",
            "" if same else "+".join(r["phases"]),
            "" if same else f"{_pct(of(r)['phase_error_with'])} → {_pct(of(r)['phase_error'])}",
            "" if same else ", ".join(inert)])
    return grid


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calibration")
    ap.add_argument("studies", nargs="+")
    ap.add_argument("--json", help="write the rows here as well")
    args = ap.parse_args()
    rows = ablation(args.calibration, args.studies)
    from rich.console import Console

    from scaletrain.grid import rich_table

    console = Console(width=160)
    for study in [None, *args.studies]:
        title = (f"each correction left out, calibration {args.calibration}: "
                 + (f"every study ({', '.join(args.studies)})" if study is None else study))
        console.print(rich_table(table(rows, title, study)))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
