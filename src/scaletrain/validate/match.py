"""A prediction against measured runs: which point each run is, and how far off each predicted number was.

Pure functions over dicts (prediction.json, see docs/validate.md) and MeasuredRun records; nothing here
reads a file, prints or draws. `validate` returns the whole of validation.json.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.validate.stats import quantile, signs, spread

FORMAT = 1
MATCH_KEYS = ("model", "dataset", "batch_size", "nproc", "nnodes", "workers", "precision", "strategy", "compress",
              "ps_servers", "image_size", "threads")
"""The settings a run must share with a prediction point to be that point (a key the point lacks is not compared,
nor threads that the run did not record)."""
PHASE_SHARE_FLOOR = 0.02
"""A phase under this share of the measured step gets no relative error (a few % of a tiny phase means nothing)."""
_DEFAULTS = {"nnodes": 1, "compress": "none"}  # what an absent (or null) setting means in a run's config


@dataclass(frozen=True)
class MeasuredRun:
    """One run directory as measured: its configuration and its summary.json's steady-state numbers."""

    run_dir: str
    config: dict[str, Any]
    step_time_s: float
    phases_s: dict[str, float] | None = None
    samples_per_s: float | None = None
    peak_memory_bytes: float | None = None
    memory_kind: str | None = None
    point: str | None = None
    """The study point the run is a repeat of (None for a run given directly)."""


def normalise(key: str, value: Any) -> Any:
    """A setting as compared: no compression is "none" whichever way it is written, one node is 1, an image
    folder is its absolute path (a run may have named it relative to where it was started)."""
    if value is None:
        return _DEFAULTS.get(key)
    if key == "dataset" and isinstance(value, str) and value.startswith("imagefolder:"):
        return "imagefolder:" + os.path.realpath(value.removeprefix("imagefolder:"))
    return value


def differences(run_config: dict[str, Any], point_config: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, run value, point value) for each MATCH_KEYS setting the point gives and the run has otherwise."""
    out = []
    for key in MATCH_KEYS:
        if key not in point_config:
            continue
        ran, predicted = normalise(key, run_config.get(key)), normalise(key, point_config[key])
        if key == "threads" and (ran is None or predicted is None):
            continue
        if ran != predicted:
            out.append((key, ran, predicted))
    return out


def _agreement(run_config: dict[str, Any], point_config: dict[str, Any]) -> int:
    """How many settings outside MATCH_KEYS (threads, bucket_cap_mb, ...) the two agree on: breaks ties."""
    return sum(1 for k, v in point_config.items()
               if k not in MATCH_KEYS and k in run_config and run_config[k] == v)


def match(run: MeasuredRun, points: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The prediction point the run is: agreeing on MATCH_KEYS, then on the most other settings; else None."""
    candidates = [p for p in points if not differences(run.config, p.get("config") or {})]
    if not candidates:
        return None
    return max(candidates, key=lambda p: _agreement(run.config, p.get("config") or {}))  # first of equals


def nearest(run: MeasuredRun, points: list[dict[str, Any]]) -> tuple[dict[str, Any], list] | None:
    """The point with the fewest differing settings, and those differences (for an unmatched run)."""
    ranked = [(p, differences(run.config, p.get("config") or {})) for p in points]
    return min(ranked, key=lambda pd: len(pd[1])) if ranked else None


def relative(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured; None when either is missing or nothing was measured."""
    if predicted is None or measured is None or measured == 0:
        return None
    return (predicted - measured) / measured


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def measured_of(runs: list[MeasuredRun]) -> tuple[dict[str, Any], list[str]]:
    """The mean over the runs (the repeats of one point) of each measurement; notes on what could not be averaged."""
    notes = []
    profiled = [r.phases_s for r in runs if r.phases_s]
    phases = None
    if profiled:
        names = [p for p in profiled[0] if all(p in ph for ph in profiled)]
        phases = {p: statistics.fmean(ph[p] for ph in profiled) for p in names}
    kinds = {r.memory_kind for r in runs if r.peak_memory_bytes is not None}
    memory, kind = None, None
    if len(kinds) == 1:
        kind = kinds.pop()
        memory = _mean(r.peak_memory_bytes for r in runs)
    elif kinds:
        notes.append(f"peak memory not averaged: the runs measured different kinds ({', '.join(map(str, kinds))})")
    # each repeat's throughput by its folder's name (a study's r0, r1, ...): the same round of two points
    # pairs them when validation takes their ratio (ratios.py)
    rounds = {Path(r.run_dir).name: r.samples_per_s for r in runs if r.samples_per_s}
    return {"step_time_s": statistics.fmean(r.step_time_s for r in runs), "phases_s": phases,
            "samples_per_s": _mean(r.samples_per_s for r in runs), "peak_memory_bytes": memory,
            "memory_kind": kind, "repeats": len(runs), "spread": spread([r.step_time_s for r in runs]),
            "samples_per_s_by_repeat": rounds if len(rounds) == len(runs) else None}, notes


def predicted_memory_kind(prediction: dict[str, Any], point: dict[str, Any]) -> str | None:
    """The kind of memory the prediction is of: stated (point, then prediction), else from the device; None: unsaid."""
    stated = point.get("memory_kind") or prediction.get("memory_kind")
    if stated:
        return stated
    device = str((point.get("config") or {}).get("device") or "")
    return "cuda" if device.startswith("cuda") else "rss" if device == "cpu" else None


def point_errors(measured: dict[str, Any], predicted: dict[str, Any]) -> dict[str, Any]:
    """Relative errors of step time, samples/s and peak memory; per phase the difference, and the relative
    error where the measured phase is above PHASE_SHARE_FLOOR of the measured step."""
    step = measured["step_time_s"]
    phases = {}
    for name, value in (measured.get("phases_s") or {}).items():
        guess = (predicted.get("phases_s") or {}).get(name)
        if guess is None:
            continue
        big = step > 0 and value > PHASE_SHARE_FLOOR * step
        phases[name] = {"relative": relative(guess, value) if big else None, "difference_s": guess - value,
                        "measured_share": value / step if step > 0 else None}
    memory_ok = predicted.get("memory_kind") is None or predicted["memory_kind"] == measured.get("memory_kind")
    return {"step_time": relative(predicted.get("step_time_s"), step), "phases": phases,
            "samples_per_s": relative(predicted.get("samples_per_s"), measured.get("samples_per_s")),
            "peak_memory": relative(predicted.get("peak_memory_bytes"), measured.get("peak_memory_bytes"))
            if memory_ok else None}


def largest_phase_error(errors: dict[str, Any]) -> tuple[str, dict[str, float | None]] | None:
    """The phase the prediction missed by the most time (its difference and relative error), None without phases."""
    phases = errors.get("phases") or {}
    if not phases:
        return None
    name = max(phases, key=lambda p: abs(phases[p]["difference_s"]))
    return name, phases[name]


def error_summary(errors: list[float], spreads: list[float | None] | None = None) -> dict[str, Any]:
    """Over the points' step-time errors: count, median/p90/max of |error|, mean signed error, shares within
    5/10%, signs (ratios.signs), and with each point's spread of its repeats: their median and how many points
    err by more than theirs."""
    if not errors:
        return {"count": 0, "median_abs_error": None, "p90_abs_error": None, "max_abs_error": None,
                "mean_signed_error": None, "within_5pct": None, "within_10pct": None, "over": 0, "under": 0,
                "biased": False, "median_spread": None, "beyond_spread": 0, "with_spread": 0}
    absolute = [abs(e) for e in errors]
    within = lambda bound: sum(1 for a in absolute if a <= bound + 1e-12) / len(absolute)  # noqa: E731
    paired = [(abs(e), sp) for e, sp in zip(errors, spreads or []) if sp is not None]
    return {"count": len(errors), "median_abs_error": quantile(absolute, 0.5), "p90_abs_error": quantile(absolute, 0.9),
            "max_abs_error": max(absolute), "mean_signed_error": statistics.fmean(errors),
            "within_5pct": within(0.05), "within_10pct": within(0.10), **signs(errors),
            "median_spread": quantile([sp for _, sp in paired], 0.5) if paired else None,
            "beyond_spread": sum(1 for e, sp in paired if e > sp), "with_spread": len(paired)}


def phase_summary(points: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per phase, over the points where it got a relative error: count, mean signed, median |error|, min, max."""
    by_phase: dict[str, list[float]] = {}
    for p in points:
        for name, e in p["errors"]["phases"].items():
            by_phase.setdefault(name, [])
            if e["relative"] is not None:
                by_phase[name].append(e["relative"])
    return {name: {"count": len(v), "mean_signed_error": statistics.fmean(v) if v else None,
                   "median_abs_error": quantile([abs(x) for x in v], 0.5) if v else None,
                   "min_error": min(v, default=None), "max_error": max(v, default=None)}
            for name, v in by_phase.items()}


def _predicted(prediction: dict[str, Any], point: dict[str, Any]) -> dict[str, Any]:
    return {"step_time_s": point.get("step_time_s"), "phases_s": point.get("phases_s"),
            "samples_per_s": point.get("samples_per_s"), "peak_memory_bytes": point.get("peak_memory_bytes"),
            "memory_kind": predicted_memory_kind(prediction, point)}


def _unmatched(run: MeasuredRun, points: list[dict[str, Any]]) -> dict[str, Any]:
    near = nearest(run, points)
    return {"run_dir": run.run_dir, "point": run.point,
            "config": {k: normalise(k, run.config.get(k)) for k in MATCH_KEYS},
            "nearest": near[0].get("id") if near else None,
            "differs": [{"key": k, "run": a, "prediction": b} for k, a, b in near[1]] if near else []}


def describe_unmatched(u: dict[str, Any]) -> str:
    """One line: the run, and how the nearest prediction point differs from it."""
    what = f"{u['run_dir']}" + (f" (study point {u['point']})" if u.get("point") else "")
    if not u.get("nearest"):
        return f"{what}: the prediction has no points"
    shown = lambda v: json.dumps(v, default=str)  # noqa: E731 - "none" and 2 read apart, as in the files
    diff = ", ".join(f"{d['key']} (run {shown(d['run'])}, predicted {shown(d['prediction'])})" for d in u["differs"])
    return f"{what}: nearest prediction point {u['nearest']} differs in {diff}"


def validate(prediction: dict[str, Any], runs: list[MeasuredRun]) -> dict[str, Any]:
    """validation.json: each prediction point with runs matched to it (their mean), its errors, the summary."""
    points = prediction.get("points") or []
    matched: dict[str, list[MeasuredRun]] = {}
    unmatched = []
    for run in runs:
        point = match(run, points)
        if point is None:
            unmatched.append(_unmatched(run, points))
        else:
            matched.setdefault(point["id"], []).append(run)
    out_points, notes = [], []
    for point in points:  # in the prediction's order
        mine = matched.get(point["id"])
        if not mine:
            continue
        measured, why = measured_of(mine)
        notes += [f"{point['id']}: {w}" for w in why]
        predicted = _predicted(prediction, point)
        errors = point_errors(measured, predicted)
        kinds = predicted["memory_kind"], measured["memory_kind"]
        if None not in kinds and kinds[0] != kinds[1] and measured["peak_memory_bytes"] is not None:
            notes.append(f"{point['id']}: peak memory not compared: the prediction is of {kinds[0]}, "
                         f"the runs measured {kinds[1]}")
        out_points.append({"id": point["id"], "config": point.get("config") or {},
                           "run_dirs": [r.run_dir for r in mine], "measured": measured, "predicted": predicted,
                           "errors": errors})
    from scaletrain.validate import ratios

    timed = [p for p in out_points if p["errors"]["step_time"] is not None]
    ratio_rows = ratios.ratios(out_points)
    return {"format": FORMAT, "kind": "validation", "basis": prediction.get("basis"),
            "basis_note": prediction.get("basis_note"), "points": out_points, "unmatched": unmatched,
            "unmeasured_points": [p["id"] for p in points if p["id"] not in matched],
            "summary": error_summary([p["errors"]["step_time"] for p in timed],
                                     [p["measured"]["spread"] for p in timed]),
            "ratios": ratio_rows, "ratio_summary": ratios.summary(ratio_rows),
            "phase_summary": phase_summary(out_points), "notes": notes}


def summary_line(summary: dict[str, Any]) -> str:
    """`step time: median |error| 3.2%, p90 7.9% over 26 points`."""
    n = summary["count"]
    if not n:
        return "step time: no point to compare"
    line = (f"step time: median |error| {100 * summary['median_abs_error']:.1f}%, "
            f"p90 {100 * summary['p90_abs_error']:.1f}% over {n} point{'s' if n != 1 else ''}")
    return line + sign_words(summary)


def sign_words(summary: dict[str, Any]) -> str:
    """`; 3 over, 2 under; 2 of 5 beyond their repeats' spread (median 6.1%)`, or a bias named."""
    if "over" not in summary:
        return ""
    words = f"; {summary['over']} over, {summary['under']} under"
    if summary.get("biased"):
        words += " (every error one sign: biased)"
    if summary.get("with_spread"):
        words += f"; {summary['beyond_spread']} of {summary['with_spread']} beyond their repeats' spread"
        if summary.get("median_spread") is not None:
            words += f" (median {100 * summary['median_spread']:.1f}%)"
    return words


__all__ = ["FORMAT", "MATCH_KEYS", "PHASE_SHARE_FLOOR", "MeasuredRun", "normalise", "differences", "match",
           "nearest", "relative", "measured_of", "point_errors", "largest_phase_error", "quantile", "error_summary",
           "phase_summary", "describe_unmatched", "validate", "summary_line", "sign_words"]
