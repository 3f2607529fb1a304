"""The report's plots as PNG files: each function takes data, draws it off-screen and returns the path.

Figures are built with matplotlib's object API and written through the one plot layer (plot.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from scaletrain.plot import phase_color, save
from scaletrain.report.series import PHASE_LABELS, Line, phase_names

def _stack_legend(ax) -> None:
    """Legend beside the plot, top entry = top of the stack, so it reads like the bars."""
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
              frameon=False)


def phase_bars(bars: dict[str, dict[str, float]], path: str | Path, title: str) -> Path:
    """One stacked bar per label (a rank, a point, a run): milliseconds per step of each phase."""
    labels = list(bars)
    names = phase_names(bars.values())
    fig = Figure(figsize=(max(5.0, 1.0 + 0.9 * len(labels)), 4.0))
    ax = fig.subplots()
    bottom = [0.0] * len(labels)
    for name in names:
        heights = [1000 * bars[label].get(name, 0.0) for label in labels]
        ax.bar(labels, heights, bottom=bottom, label=PHASE_LABELS.get(name, name), color=phase_color(name, names))
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_ylabel("ms per step")
    ax.set_title(title)
    if len(labels) > 4 or max(map(len, labels), default=0) > 10:
        ax.tick_params(axis="x", labelrotation=30)
        for tick in ax.get_xticklabels():
            tick.set_horizontalalignment("right")
    _stack_legend(ax)
    return save(fig, path)


def step_time_lines(lines: dict[int, Line], path: str | Path) -> Path:
    """Step time over global steps, one line per rank."""
    fig = Figure(figsize=(7.5, 3.8))
    ax = fig.subplots()
    for line in lines.values():
        ax.plot(line.xs, [1000 * y for y in line.ys], label=line.label, linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    ax.set_title("step time per rank")
    ax.set_ylim(bottom=0)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", frameon=False)
    return save(fig, path)


def phase_share_area(steps: list[int], shares: dict[str, list[float]], path: str | Path) -> Path:
    """Each phase's share of the step over the steps (mean over ranks), stacked to 100%."""
    names = list(shares)
    fig = Figure(figsize=(7.5, 3.8))
    ax = fig.subplots()
    ax.stackplot(steps, *[[100 * v for v in shares[n]] for n in names],
                 labels=[PHASE_LABELS.get(n, n) for n in names], colors=[phase_color(n, names) for n in names])
    ax.set_xlabel("step")
    ax.set_ylabel("% of step time")
    ax.set_ylim(0, 100)
    ax.set_xlim(steps[0], steps[-1] if len(steps) > 1 else steps[0] + 1)
    ax.set_title("phase shares over steps (mean over ranks)")
    _stack_legend(ax)
    return save(fig, path)


MAX_TICKS = 12


def line_plot(lines: Sequence[Line], path: str | Path, title: str, xlabel: str, ylabel: str,
              reference: Sequence[Line] = (), markers: bool = True) -> Path:
    """Lines (one per series, with markers unless `markers` is off); `reference` lines (e.g. ideal speedup)
    dashed in grey. Up to MAX_TICKS distinct x values get a tick each (nproc 1, 2, 4); more, matplotlib's."""
    fig = Figure(figsize=(6.5, 4.0))
    ax = fig.subplots()
    for line in reference:
        ax.plot(line.xs, line.ys, linestyle="--", color="0.5", label=line.label)
    for line in lines:
        ax.plot(line.xs, line.ys, marker="o" if markers or len(line.xs) == 1 else None, label=line.label)
    xs = sorted({x for line in [*lines, *reference] for x in line.xs})
    if len(xs) <= MAX_TICKS:
        ax.set_xticks(xs)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", frameon=False)
    return save(fig, path)


def stage_timeline(spans: dict[int, list[tuple[str, float, float]]], labels: dict[int, str], path: str | Path,
                   title: str) -> Path:
    """One row per rank (a pipeline stage), its step's phases as coloured spans along a common time axis:
    where each stage computes and where it waits on its neighbours (the bubble)."""
    ranks = list(spans)
    names = phase_names([{name: 1.0 for name, _, _ in s} for s in spans.values()])
    fig = Figure(figsize=(9.0, 1.2 + 0.55 * len(ranks)))
    ax = fig.subplots()
    seen: set[str] = set()
    for row, rank in enumerate(ranks):
        for name, a, b in spans[rank]:
            ax.broken_barh([(1000 * a, 1000 * (b - a))], (row - 0.4, 0.8), color=phase_color(name, names),
                           label=None if name in seen else PHASE_LABELS.get(name, name))
            seen.add(name)
    ax.set_yticks(range(len(ranks)), [labels.get(r, f"rank {r}") for r in ranks])
    ax.invert_yaxis()  # stage 0 on top
    ax.set_xlabel("ms from the step's start on the earliest rank")
    ax.set_xlim(left=0)
    ax.set_title(title)
    handles, texts = ax.get_legend_handles_labels()
    order = sorted(range(len(texts)), key=lambda i: [PHASE_LABELS.get(n, n) for n in names].index(texts[i]))
    ax.legend([handles[i] for i in order], [texts[i] for i in order], loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize="small", frameon=False)
    return save(fig, path)
