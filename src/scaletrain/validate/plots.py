"""The validation's plots as PNG files: predicted against measured step time, and the error of each phase.

Drawn with matplotlib's object API and written through the one plot layer (plot.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from scaletrain.plot import PHASE_COLORS, save
from scaletrain.report.series import PHASE_LABELS, phase_names

LOG_SPAN = 10.0
"""Axes go log-log when the largest step time is more than this many times the smallest."""
BAND = 0.10
"""The shaded band around y = x: predictions within this relative error."""
LABELLED = 12
"""Up to this many points are labelled with their id on the scatter."""


def step_time_scatter(points: list[dict[str, Any]], path: str | Path, title: str) -> Path:
    """Predicted against measured step time (ms), one dot per point, with y = x and a ±BAND band."""
    pairs = [(1000 * p["measured"]["step_time_s"], 1000 * p["predicted"]["step_time_s"], p["id"]) for p in points
             if p["predicted"].get("step_time_s") is not None]
    fig = Figure(figsize=(5.5, 5.0))
    ax = fig.subplots()
    values = [v for m, q, _ in pairs for v in (m, q) if v > 0]
    lo, hi = (min(values), max(values)) if values else (1.0, 10.0)
    log = hi / lo > LOG_SPAN
    lo, hi = (lo / 1.3, hi * 1.3) if log else (0.0, hi * 1.15)
    ref = [lo, hi] if not log else [lo * (hi / lo) ** (i / 50) for i in range(51)]
    ax.fill_between(ref, [(1 - BAND) * x for x in ref], [(1 + BAND) * x for x in ref], color="0.9",
                    label=f"within ±{100 * BAND:.0f}%")
    ax.plot(ref, ref, linestyle="--", color="0.5", label="predicted = measured")
    ax.scatter([m for m, _, _ in pairs], [q for _, q, _ in pairs], color="#1f77b4", zorder=3, label="points")
    if len(pairs) <= LABELLED:
        for m, q, name in pairs:
            ax.annotate(name, (m, q), textcoords="offset points", xytext=(4, 4), fontsize="x-small")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title(title)
    ax.legend(fontsize="small", frameon=False, loc="upper left")
    return save(fig, path)


def phase_errors(summary: dict[str, dict[str, Any]], path: str | Path) -> Path:
    """Per phase: the mean signed relative error over the points (bar), from the smallest to the largest (whisker)."""
    names = [n for n in phase_names([summary]) if summary[n]["count"]]
    fig = Figure(figsize=(max(5.0, 1.0 + 0.9 * len(names)), 4.0))
    ax = fig.subplots()
    means = [100 * summary[n]["mean_signed_error"] for n in names]
    low = [m - 100 * summary[n]["min_error"] for m, n in zip(means, names)]
    high = [100 * summary[n]["max_error"] - m for m, n in zip(means, names)]
    labels = [f"{PHASE_LABELS.get(n, n)} ({summary[n]['count']})" for n in names]
    ax.bar(labels, means, yerr=[low, high], capsize=4, color=[PHASE_COLORS.get(n, "#17becf") for n in names])
    ax.axhline(0, color="0.3", linewidth=0.8)
    ax.set_ylabel("(predicted - measured) / measured (%)")
    ax.set_title("phase errors over the points: mean (bar), smallest to largest (whiskers)", fontsize="medium")
    ax.set_xlabel("phase (points with a relative error)")
    ax.tick_params(axis="x", labelrotation=30)
    for tick in ax.get_xticklabels():
        tick.set_horizontalalignment("right")
    return save(fig, path)
