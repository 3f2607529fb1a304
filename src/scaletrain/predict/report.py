"""A prediction shown to people: the scaling table, speedup against ideal, phases per point, what limits it.

Pure presentation of prediction.json's dict (the keys read: docs/validate.md): nothing is computed
here that the prediction does not already hold, except the ideal speedup (speedup / efficiency).
Writes OUT/report.html (self-contained, like every scaletrain report) and OUT/plots/*.png.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from scaletrain import fmt
from scaletrain.perf.memory import PARTS
from scaletrain.report import plots
from scaletrain.report.html import Section, page, write_page
from scaletrain.report.output import check_report_dir, writing
from scaletrain.report.series import PHASE_LABELS, Line, phase_names
from scaletrain.grid import Grid, rich_table

REPORT = "report.html"
PLOTS = "plots"
SHOWN = ("nproc", "nnodes", "batch_size", "workers", "strategy")
"""Settings that always have a column in the scaling table; other settings get one when they vary."""
HEADS = {"batch_size": "batch", "ps_servers": "servers", "image_size": "image"}
SERIES_FREE = ("nproc", "nnodes", "batch_size")
"""What changes along one speedup line (the lead's rule: speedups are relative within a series)."""
NAMED = ("model", "dataset", "precision", "compress", "ps_servers", "image_size", "threads")
"""Settings named under the table when the same for every point (with the axes given one value)."""


def _setting(point: dict[str, Any], key: str) -> Any:
    config = point.get("config") or {}
    return config[key] if key in config else (point.get("axes") or {}).get(key)


def _processes(point: dict[str, Any]) -> int:
    return (_setting(point, "nproc") or 1) * (_setting(point, "nnodes") or 1)


def ideal_speedup(point: dict[str, Any]) -> float | None:
    """As given, else speedup / efficiency (efficiency = speedup / ideal); None when neither says."""
    if point.get("ideal_speedup") is not None:
        return point["ideal_speedup"]
    s, e = point.get("speedup"), point.get("efficiency")
    return s / e if s is not None and e else None


def basis_line(prediction: dict[str, Any]) -> str:
    """What the prediction rests on, in one sentence; a data-sheet prediction says it was not measured here."""
    note = prediction.get("basis_note") or "no note on the basis"
    if prediction.get("basis") == "datasheet":
        return (f"Data-sheet prediction: computed from published figures, not from a calibration of this "
                f"machine; expect larger errors ({note})")
    if prediction.get("basis") == "calibration":
        return f"Predicted from a calibration measured on this machine ({note}){probe_words(prediction)}"
    return f"Prediction basis: {prediction.get('basis') or 'not stated'} ({note})"


def probe_words(prediction: dict[str, Any]) -> str:
    """The speed probe in words: how fast this machine runs now against when it was calibrated."""
    probe = prediction.get("speed_probe")
    if not probe:
        return ""
    if not probe.get("applied"):
        return f"; no speed probe: {probe.get('why')}"
    ratios = ", ".join(f"{r['ratio']:.2f} at {t} thread{'s' if t != '1' else ''}"
                       for t, r in sorted(probe["threads"].items(), key=lambda kv: int(kv[0])))
    return f"; speed probe: compute takes {ratios} of its calibrated time now, and is scaled by it"


def _columns(points: list[dict[str, Any]], axes: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The settings shown as columns, and those the same for every point (named under the table)."""
    keys = list(SHOWN) + [a for a in axes if a not in SHOWN]
    keys += [k for k in dict.fromkeys(k for p in points for k in p.get("config") or {}) if k not in keys]
    varying = [k for k in keys if len({json.dumps(_setting(p, k), default=str) for p in points}) > 1]
    columns = [k for k in keys if k in SHOWN or k in varying]
    fixed = {k: _setting(points[0], k) for k in keys if k not in columns and (k in axes or k in NAMED)
             and _setting(points[0], k) is not None} if points else {}
    return columns, fixed


def scaling_table(prediction: dict[str, Any]) -> Grid:
    """The thesis table: one row per predicted point, its configuration, time, throughput, scaling, memory, limit."""
    points = prediction.get("points") or []
    columns, fixed = _columns(points, prediction.get("axes") or {})
    g = Grid("predicted scaling: step and epoch time, speedup and efficiency per point",
             [*(HEADS.get(c, c) for c in columns), "step time", "epoch time", "samples/s", "speedup", "ideal",
              "efficiency", "peak memory", "limit"],
             text_columns=(*range(len(columns)), len(columns) + 7))
    for p in points:
        g.rows.append([*(fmt.setting(_setting(p, c)) for c in columns), fmt.duration(p.get("step_time_s")),
                       fmt.value("seconds", p.get("epoch_time_s")), fmt.rate(p.get("samples_per_s")),
                       fmt.factor(p.get("speedup")), fmt.factor(ideal_speedup(p)), fmt.share(p.get("efficiency"), 0),
                       fmt.size(p.get("peak_memory_bytes")), _limit_cell(p)])
    same = "; ".join(f"{k} = {fmt.setting(v)}" for k, v in fixed.items())
    g.note = ("speedup: against the point with the fewest processes in the point's series (the points sharing "
              "every setting but nproc, nnodes and batch); ideal = the linear speedup; efficiency = speedup / ideal"
              + (f". Same for every point: {same}" if same else "")
              + (". implausible: the point's implied FLOP rate or epoch is not credible (notes say why)"
                 if any(_implausible(p) for p in points) else ""))
    return g


def _implausible(point: dict[str, Any]) -> bool:
    return bool((point.get("plausibility") or {}).get("flag"))


def _limit_cell(point: dict[str, Any]) -> str:
    limit = point.get("limit") or fmt.DASH
    return f"{limit} (implausible)" if _implausible(point) else limit


def limits_table(prediction: dict[str, Any]) -> Grid:
    g = Grid("what limits each point", ["point", "limit", "why"], text_columns=(0, 1, 2))
    g.rows = [[p["id"], p.get("limit") or fmt.DASH, p.get("limit_note") or ""] for p in prediction.get("points") or []]
    return g


def scaling_lead(scaling: dict[str, Any]) -> str | None:
    """`communication limits scaling first; efficiency falls below 80% at 8 processes, below 50% at 32`."""
    parts = []
    if scaling.get("first_limit"):
        parts.append(f"{scaling['first_limit']} limits scaling first")
    falls = [f"below {level}% at {scaling[key]} processes" for level, key in
             ((80, "efficiency_below_80_at"), (50, "efficiency_below_50_at")) if scaling.get(key) is not None]
    if falls:
        parts.append("efficiency falls " + ", ".join(falls))
    elif "efficiency_below_80_at" in scaling:
        parts.append("efficiency stays at 80% or above over the predicted points")
    return "; ".join(parts) or None


def phases_table(prediction: dict[str, Any]) -> Grid:
    points = prediction.get("points") or []
    names = phase_names(p.get("phases_s") for p in points)
    g = Grid("predicted phases per point (per step)",
             ["point", *[PHASE_LABELS.get(n, n) for n in names], "step", "layer times from"])
    for p in points:
        ph, step = p.get("phases_s") or {}, p.get("step_time_s")
        cells = [f"{fmt.duration(ph[n])} ({fmt.share(ph[n] / step, 0)})" if n in ph and step else
                 fmt.duration(ph.get(n)) for n in names]
        layers = p.get("layers") or {}
        source = ", ".join(f"{v} {k}" for k, v in layers.items() if v) or fmt.DASH
        g.rows.append([p["id"], *cells, fmt.duration(step), source])
    g.text_columns = (0, len(g.columns) - 1)
    return g


def comm_memory_table(prediction: dict[str, Any]) -> Grid:
    points = prediction.get("points") or []
    parts = list(dict.fromkeys(k for p in points for k in (p.get("memory_bytes") or {})))
    g = Grid("predicted communication and memory per rank",
             ["point", "bytes sent/step", "buckets", "comm time", "hidden", "overlap",
              *[PARTS.get(m, m) for m in parts], "peak memory"])
    for p in points:
        c, mem = p.get("comm") or {}, p.get("memory_bytes") or {}
        buckets = c.get("buckets")
        g.rows.append([p["id"], fmt.size(c.get("bytes_per_step")), fmt.DASH if buckets is None else str(buckets),
                       fmt.duration(c.get("comm_total_s")), fmt.duration(c.get("comm_hidden_s")),
                       fmt.share(c.get("overlap_ratio"), 0), *[fmt.size(mem.get(m)) for m in parts],
                       fmt.size(p.get("peak_memory_bytes"))])
    return g


def basis_tables(prediction: dict[str, Any]) -> list[Grid]:
    """Where the numbers come from: the network model and the per-layer regressions' cross-validated error."""
    net = prediction.get("network") or {}
    g = Grid(f"network model ({net.get('source') or 'source not stated'})", ["link", "latency (alpha)",
                                                                             "bandwidth (1/beta)"])
    for link in ("intra", "inter"):
        ab = net.get(link) or {}
        # inside a node one fit per exchange (allreduce, ring, ps, halo); across nodes one link
        fits = {f"{link}-node": ab} if "alpha_s" in ab else {f"{link}-node {k}": f for k, f in ab.items()}
        for name, fit in fits.items():
            beta = fit.get("beta_s_per_byte")
            bandwidth = f"{fmt.size(1 / beta)}/s" if beta else fmt.DASH
            g.rows.append([name, _latency(fit.get("alpha_s")), bandwidth])
    if not g.rows:
        g.note = "no network model (a single process communicates nothing)"
    r = Grid("per-layer timing laws: cross-validated error", ["layer kind", "median |error|", "points"])
    for kind, fit in (prediction.get("regression") or {}).items():
        r.rows.append([kind, fmt.share(fit.get("cv_median_abs_error")), fmt.setting(fit.get("points"))])
    if not r.rows:
        r.note = "no regression: every layer was measured directly, or from its roofline"
    return [g, r]


def _latency(seconds: float | None) -> str:
    """Microseconds below a millisecond (a link's latency), else as durations are shown."""
    return f"{1e6 * seconds:.1f} us" if seconds is not None and seconds < 1e-3 else fmt.duration(seconds)


def _speedup_lines(points: list[dict[str, Any]]) -> tuple[list[Line], list[Line]]:
    """Predicted and ideal speedup against processes, one line per series."""
    varying = [a for a in dict.fromkeys(a for p in points for a in p.get("axes") or {})
               if a not in SERIES_FREE and len({json.dumps(_setting(p, a), default=str) for p in points}) > 1]
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        label = ", ".join(f"{a}={fmt.setting(_setting(p, a))}" for a in varying) or "predicted"
        groups.setdefault(label, []).append(p)
    lines, ideals = [], set()
    for label, members in groups.items():
        xy = sorted((_processes(p), p["speedup"], ideal_speedup(p)) for p in members if p.get("speedup") is not None)
        if xy:
            lines.append(Line(label, [x for x, _, _ in xy], [y for _, y, _ in xy]))
            ideals |= {(x, i) for x, _, i in xy if i is not None}
    ideal = sorted(ideals)
    return lines, [Line("ideal", [x for x, _ in ideal], [i for _, i in ideal])] if ideal else []


def _figures(prediction: dict[str, Any], out: Path) -> tuple[list, list, list[str]]:
    points, notes = prediction.get("points") or [], []
    scaling, phases = [], []
    lines, ideal = _speedup_lines(points)
    if len({_processes(p) for p in points}) > 1 and lines:
        xlabel = "processes (nproc x nnodes)" if any((_setting(p, "nnodes") or 1) > 1 for p in points) else \
            "processes (nproc)"
        scaling.append((plots.line_plot(lines, out / "speedup.png", "predicted speedup against ideal", xlabel,
                                        "speedup (x)", reference=ideal),
                        "predicted speedup against the processes, one line per series, the ideal (linear) dashed"))
    else:
        notes.append("speedup plot: not drawn, the points have only one process count")
    bars = {p["id"]: p["phases_s"] for p in points if p.get("phases_s")}
    if bars:
        phases.append((plots.phase_bars(bars, out / "phases-per-point.png", "predicted time per step, by phase"),
                       "predicted milliseconds per step of each phase, per point"))
    else:
        notes.append("phases per point: not drawn, no point has predicted phases")
    return scaling, phases, notes


def write_prediction_report(prediction: dict[str, Any], out_dir: Path) -> Path:
    """OUT/report.html and OUT/plots/*.png of a prediction; returns the page's path."""
    out_dir = Path(out_dir)
    with writing(out_dir / REPORT):
        out_dir.mkdir(parents=True, exist_ok=True)
        check_report_dir(out_dir, REPORT, PLOTS)
        scaling_figs, phase_figs, notes = _figures(prediction, out_dir / PLOTS)
        scaling = prediction.get("scaling") or {}
        limits_notes = [*(scaling.get("notes") or []), *notes]
        datasheet = prediction.get("basis") == "datasheet"
        sections = [
            Section("scaling", lead=basis_line(prediction), grids=[scaling_table(prediction)], figures=scaling_figs),
            Section("what limits scaling", lead=scaling_lead(scaling), grids=[limits_table(prediction)],
                    notes=limits_notes),
            Section("where the time goes", grids=[phases_table(prediction)], figures=phase_figs),
            Section("communication and memory", grids=[comm_memory_table(prediction)]),
            Section("what the prediction rests on", lead=basis_line(prediction), grids=basis_tables(prediction),
                    notes=[*(prediction.get("notes") or []), *skipped_lines(prediction)]),
        ]
        axes = "; ".join(f"{a}: {fmt.setting(v)}" for a, v in (prediction.get("axes") or {}).items())
        title = "prediction (data sheet, not calibrated)" if datasheet else "prediction"
        subtitle = (f"{len(prediction.get('points') or [])} points — {axes}" if axes else
                    f"{len(prediction.get('points') or [])} points") + \
            f" — scaletrain {prediction.get('scaletrain_version') or '?'}"
        return write_page(out_dir / REPORT, page(title, subtitle, sections))


def print_prediction(prediction: dict[str, Any], console: Console) -> None:
    """The basis, the scaling table and what limits scaling, for the terminal."""
    say = lambda line: console.print(line, soft_wrap=True, highlight=False, markup=False)  # noqa: E731
    say(basis_line(prediction))
    console.print(rich_table(scaling_table(prediction)))
    scaling = prediction.get("scaling") or {}
    lead = scaling_lead(scaling)
    if lead:
        say(lead[0].upper() + lead[1:] + ".")
    for note in [*(scaling.get("notes") or []), *(prediction.get("notes") or [])]:
        say(f"note: {note}")
    for line in skipped_lines(prediction):
        say(line)


def skipped_lines(prediction: dict[str, Any]) -> list[str]:
    """One line per point left out of the grid because its settings do not combine, with the reason."""
    return [f"skipped {s['id']}: {s['reason']}" for s in prediction.get("skipped") or []]


__all__ = ["write_prediction_report", "print_prediction", "scaling_table", "limits_table", "phases_table",
           "comm_memory_table", "basis_tables", "basis_line", "scaling_lead", "ideal_speedup"]
