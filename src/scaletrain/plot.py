"""The one plot layer: phase colours shared by every figure, and the one way a figure reaches a file.

Figures are built with matplotlib's object API (Figure + Agg canvas), never pyplot: no window, no global backend
switch, nothing left open between plots. A figure is written atomically (rundir.replace_atomic) with no date or
software stamp, so that drawing the same data twice writes the same bytes.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from scaletrain.rundir import replace_atomic

# one colour per phase everywhere (runs, studies, comparisons, validation), from matplotlib's tab10
PHASE_COLORS = {"data_wait": "#ff7f0e", "h2d": "#8c564b", "forward": "#1f77b4", "backward": "#2ca02c",
                "comm_exposed": "#d62728", "optimizer": "#9467bd", "bubble": "#e377c2", "p2p": "#17becf",
                "halo": "#bcbd22", "gather": "#aec7e8", "other": "#7f7f7f"}
EXTRA_COLORS = ("#ffbb78", "#98df8a", "#ff9896")


def phase_color(phase: str, names: list[str]) -> str:
    """A phase's colour; a phase without one of its own takes the next extra colour in the order of `names`."""
    if phase in PHASE_COLORS:
        return PHASE_COLORS[phase]
    extras = [n for n in names if n not in PHASE_COLORS]
    return EXTRA_COLORS[extras.index(phase) % len(EXTRA_COLORS)]


def save(fig: Figure, path: str | Path, dpi: float = 100, tight: bool = True) -> Path:
    """Write the figure to `path` (PNG or SVG by its suffix), creating its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kind = path.suffix.lstrip(".").lower() or "png"
    stamp = {"Date": None} if kind == "svg" else {"Software": None}
    extra = {"bbox_inches": "tight"} if tight else {}
    replace_atomic(path, lambda f: fig.savefig(f, format=kind, dpi=dpi, metadata=stamp, **extra))
    return path
