"""What the plots draw, derived from step records and study points (pure functions; no drawing)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import mean
from typing import Any

# the profiler's phases in step order (scaletrain.analysis.timeline.phase_names with a strategy's own;
# repeated here so that a report does not import the profiler, and through it torch)
PHASES = ("data_wait", "h2d", "forward", "backward", "comm_exposed", "optimizer", "bubble", "p2p", "halo", "gather",
          "other")
PHASE_LABELS = {"data_wait": "data wait", "h2d": "host to device", "forward": "forward", "backward": "backward",
                "comm_exposed": "communication (exposed)", "optimizer": "optimizer", "bubble": "pipeline bubble",
                "p2p": "pipeline send/receive", "halo": "tiles' halo exchange", "gather": "tiles' gather",
                "other": "other"}


@dataclass(frozen=True)
class Line:
    """One line of a plot: a label and its points, sorted by x."""

    label: str
    xs: list[Any]
    ys: list[float]


def phase_names(phase_dicts: Iterable[dict[str, float] | None]) -> list[str]:
    """The phases present, in step order; phases this code does not know yet go last, by name."""
    present = {k for d in phase_dicts if d for k in d}
    return [p for p in PHASES if p in present] + sorted(present - set(PHASES))


def step_times(records_by_rank: dict[int, list[dict]]) -> dict[int, Line]:
    """Each rank's step time over global steps."""
    return {rank: Line(f"rank {rank}", [r["step"] for r in recs], [r["step_time_s"] for r in recs])
            for rank, recs in sorted(records_by_rank.items()) if recs}


def phase_shares(records_by_rank: dict[int, list[dict]]) -> tuple[list[int], dict[str, list[float]]] | None:
    """Per step, each phase's share of the step time (mean over the ranks that profiled it); None if none did."""
    by_step: dict[int, list[dict[str, float]]] = {}
    for recs in records_by_rank.values():
        for r in recs:
            if r.get("phases_s") and r.get("step_time_s"):
                by_step.setdefault(r["step"], []).append({k: v / r["step_time_s"] for k, v in r["phases_s"].items()})
    if not by_step:
        return None
    steps = sorted(by_step)
    names = phase_names(s for shares in by_step.values() for s in shares)
    return steps, {p: [mean(s.get(p, 0.0) for s in by_step[step]) for step in steps] for p in names}


def varying_axes(points: list[dict], axes: list[str]) -> list[str]:
    """Axes that take more than one value among the points."""
    return [a for a in axes if len({repr(p.get("axes", {}).get(a)) for p in points}) > 1]


def series_label(point: dict, axes: list[str]) -> str:
    return ", ".join(f"{a}={point.get('axes', {}).get(a)}" for a in axes) or "all points"


def study_lines(points: list[dict], axes: list[str], x_axis: str, y_key: str) -> list[Line]:
    """y_key against x_axis, one line per combination of the other varying axes; points without a y are left out."""
    others = [a for a in varying_axes(points, axes) if a != x_axis]
    groups: dict[str, list[tuple[Any, float]]] = {}
    for p in points:
        x, y = p.get("axes", {}).get(x_axis), p.get(y_key)
        label = series_label(p, others)
        groups.setdefault(label, [])
        if x is not None and y is not None:
            groups[label].append((x, y))
    lines = []
    for label, xy in groups.items():
        if xy:
            xy.sort(key=lambda t: t[0])
            lines.append(Line(label, [x for x, _ in xy], [y for _, y in xy]))
    return lines


def ideal_lines(points: list[dict], axes: list[str]) -> list[Line]:
    """Ideal speedup against nproc: one line when every series shares a baseline, else one per series."""
    per_series = [Line(f"ideal ({line.label})" if line.label != "all points" else "ideal", line.xs, line.ys)
                  for line in study_lines(points, axes, "nproc", "ideal_speedup")]
    pairs = {(x, y) for line in per_series for x, y in zip(line.xs, line.ys)}
    if len({x for x, _ in pairs}) == len(pairs):  # no nproc with two different ideals: draw it once
        xy = sorted(pairs)
        return [Line("ideal", [x for x, _ in xy], [y for _, y in xy])] if xy else []
    return per_series


@dataclass(frozen=True)
class Curve:
    """One training-curve plot to draw: file stem, labels, lines; per-epoch curves get markers."""

    name: str
    title: str
    xlabel: str
    ylabel: str
    lines: list[Line]
    caption: str
    markers: bool = True


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _points(rows: list[dict], x_key: str, y_key: str, label: str, scale: float = 1.0,
            shift: int = 0) -> tuple[Line | None, int]:
    """y_key against x_key over the rows that have it; also how many had it but not as a finite number."""
    have = [r for r in rows if r.get(y_key) is not None]
    good = [r for r in have if _finite(r[y_key])]
    line = Line(label, [r[x_key] + shift for r in good], [scale * r[y_key] for r in good]) if good else None
    return line, len(have) - len(good)


def training_curves(records_by_rank: dict[int, list[dict]],
                    epochs: list[dict]) -> tuple[list[Curve], list[str]]:
    """Loss per step and per epoch, validation top-1/top-5 per epoch, learning rate per step (or per epoch).

    Per-step values come from the lowest rank's records (rank 0: every rank has the same lr, and DDP
    ranks' losses differ only by their data). Epochs count from 1. What cannot be drawn is a note."""
    rank = min((r for r, recs in records_by_rank.items() if recs), default=None)
    steps = records_by_rank[rank] if rank is not None else []
    curves: list[Curve] = []
    notes: list[str] = []
    bad_total = 0

    loss, bad = _points(steps, "step", "loss", f"training loss (rank {rank})")
    bad_total += bad
    if loss:
        curves.append(Curve("loss-per-step", "training loss per step", "step", "loss", [loss],
                            f"training loss of every step on rank {rank}", markers=False))
    else:
        notes.append("training loss per step: not drawn, the metrics lines have no loss")

    per_epoch = []
    for key, label in (("train_loss", "training loss (epoch mean)"), ("val_loss", "validation loss")):
        line, bad = _points(epochs, "epoch", key, label, shift=1)
        bad_total += bad
        per_epoch += [line] if line else []
    if per_epoch:
        curves.append(Curve("loss-per-epoch", "loss per epoch", "epoch", "loss", per_epoch,
                            "training loss (mean over the epoch) and validation loss, per epoch"))
    else:
        notes.append("loss per epoch: not drawn, epochs.jsonl has no train_loss or val_loss (no epoch finished)")

    accuracy = []
    for key, label in (("top1", "top-1"), ("top5", "top-5")):
        line, bad = _points(epochs, "epoch", key, label, scale=100.0, shift=1)
        bad_total += bad
        accuracy += [line] if line else []
    if accuracy:
        curves.append(Curve("accuracy", "validation accuracy per epoch", "epoch", "accuracy (%)", accuracy,
                            "validation top-1 and top-5 accuracy after each evaluated epoch"))
    else:
        notes.append("validation accuracy: not drawn, no epoch was evaluated (epochs.jsonl has no top1 or top5)")

    lr, bad = _points(steps, "step", "lr", "learning rate")
    if lr:
        curves.append(Curve("lr", "learning rate per step", "step", "learning rate", [lr],
                            f"learning rate of every step (rank {rank})", markers=False))
    else:
        lr, bad = _points(epochs, "epoch", "lr", "learning rate", shift=1)
        if lr:
            curves.append(Curve("lr", "learning rate per epoch", "epoch", "learning rate", [lr],
                                "learning rate per epoch (the metrics lines have no per-step lr)"))
        else:
            notes.append("learning rate: not drawn, neither the metrics lines nor epochs.jsonl have an lr")
    bad_total += bad
    if bad_total:
        values = "value was" if bad_total == 1 else "values were"
        notes.append(f"{bad_total} loss, accuracy or learning-rate {values} not finite (nan or inf): left out "
                     "of the curves")
    return curves, notes
