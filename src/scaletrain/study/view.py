"""Rendering of a study for people: the plan, a line per run, the results table (no computation)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from scaletrain import fmt
from scaletrain.grid import Grid
from scaletrain.study.grid import Threads
from scaletrain.study.results import above_ideal, on_gpu, run_epoch_time, scaling_flags, threads_per_rank


def _secs(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3g}" if seconds < 10 else f"{seconds:.1f}"


def axes_text(axes: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in axes.items())


def run_label(point_id: str, k: int, repeats: int) -> str:
    return point_id if repeats == 1 else f"{point_id} (repeat {k + 1}/{repeats})"


def run_line(point_id: str, k: int, repeats: int, record: dict[str, Any], elapsed_s: float, log: str) -> str:
    """The one line printed after each launch."""
    label = run_label(point_id, k, repeats)
    if record["status"] != "completed":
        return f"[red]✗[/] {label} failed after {elapsed_s:.0f} s: {record['error']}  (log: {log})"
    s = record["summary"]
    t = run_epoch_time(s)
    rate = f", {fmt.rate(s['samples_per_s'], 'samples')}" if s.get("samples_per_s") is not None else ""
    top1 = f", top-1 {100 * s['top1']:.1f}%" if s.get("top1") is not None else ""
    return f"[green]✓[/] {label}: epoch {fmt.hms(t)} ({_secs(t)} s){rate}{top1}  [dim]({elapsed_s:.0f} s)[/]"


def running_line(what: str, snap, log: str) -> str:
    """`point 2/6  nproc=2: epoch 1/3  step 120/1200  10.0%  ETA 5 min 3 s  1,234 samples/s` while a run goes
    (a study in a log; `snap`: watch/state.py's Snapshot of its run directory)."""
    from scaletrain.watch.terminal import progress_line

    if snap.progress is None:
        return f"{what}: running, no step yet  (log: {log})"
    rate = f"  {fmt.rate(snap.samples_per_s_recent, 'samples')}" if snap.samples_per_s_recent is not None else ""
    return f"{what}: {progress_line(snap)}{rate}"


def _ratio(x: float | None, suffix: str = "x") -> str:
    return "-" if x is None else f"{x:.2f}{suffix}"


def _diagnosis(entry: dict[str, Any]) -> str:
    findings = entry.get("diagnosis") or []
    return findings[0].get("kind", "-") if findings else "-"


def threads_text(entry: dict[str, Any]) -> str:
    """Threads per rank as shown: a number, "gpu" (no CPU threads to speak of) or "?" (not recorded)."""
    t = threads_per_rank(entry)
    return str(t) if t is not None else "gpu" if on_gpu(entry) else "?"


def threads_line(t: Threads) -> str:
    """`threads per rank: 1 (2 cores / 2 processes, the grid's largest; --threads to change)`: one for all points."""
    if t.source == "given":
        return f"threads per rank: {t.threads} (--threads), for every point"
    if t.source == "recorded":
        return (f"threads per rank: {t.threads} for every point, as this study's study.toml records" if t.threads
                else "threads per rank: each point's own (cores / its processes): this study's study.toml sets "
                     "none, as studies did before they fixed one")
    if t.source == "node":
        return (f"threads per rank: each node's cores / {t.processes} process{'es' * (t.processes != 1)}, the "
                "grid's largest, worked out in each job on its node (--threads to change)")
    return (f"threads per rank: {t.threads} ({t.cores} core{'s' * (t.cores != 1)} / {t.processes} "
            f"process{'es' * (t.processes != 1)}, the grid's largest; --threads to change)")


def results_table(entries: list[dict[str, Any]], axes: list[str], title: str, caption: str | None = None) -> Grid:
    """Configuration columns, threads per rank, then epoch time (h:mm:ss, seconds, ± std), samples/s and scaling.

    An efficiency above 1.0 is marked "!" and explained by `flag_lines`. An open grid: a line of it is a row."""
    # status and ± only when they tell something: all completed, or a single repeat, need no column
    show_status = any(e["status"] != "completed" for e in entries)
    show_std = any(e.get("epoch_time_std_s") is not None for e in entries)
    cols = (list(axes) + ["threads/rank"] + ["status"] * show_status + ["epoch time", "seconds"] + ["±"] * show_std
            + ["samples/s", "speedup", "ideal", "efficiency", "diagnosis"])
    text = tuple(i for i, c in enumerate(cols) if c in ("status", "diagnosis")
                 or (c in axes and c not in ("nproc", "workers", "batch_size")))
    rows = []
    for e in entries:
        status = {"completed": "[green]completed[/]", "failed": "[red]failed[/]"}.get(e["status"], e["status"])
        efficiency = "-" if e.get("efficiency") is None else f"{100 * e['efficiency']:.0f}%"
        if above_ideal(e.get("efficiency")):
            efficiency = f"[red]{efficiency} ![/]"
        rows.append([*[str(e["axes"].get(a, "-")) for a in axes], threads_text(e), *[status] * show_status,
                     fmt.hms(e["epoch_time_s"]), _secs(e["epoch_time_s"]),
                     *[_secs(e.get("epoch_time_std_s"))] * show_std, fmt.number(e.get("samples_per_s")),
                     _ratio(e.get("speedup")), _ratio(e.get("ideal_speedup")), efficiency, _diagnosis(e)])
    return Grid(title, cols, rows, note=caption, text_columns=text, open=True)


def flag_lines(entries: list[dict[str, Any]]) -> list[str]:
    """One warning line per point whose efficiency is above 1.0 (study.results.scaling_flags)."""
    return [f"[yellow]warning:[/] {escape(f['message'])}" for f in scaling_flags(entries)]


def plan_table(points: list[Any], done: dict[str, list[str]], repeats: int, title: str) -> Grid:
    """--dry-run: every point with its axes and what a real run would do with each repeat."""
    g = Grid(title, ["#", "point", "axes", "runs"], text_columns=(1, 2, 3))
    todo = {"completed": "done", "failed": "rerun (failed)", "unfinished": "rerun (unfinished)", "new": "run"}
    for i, p in enumerate(points, 1):
        words = [todo[s] for s in done[p.id]]
        if len(set(words)) == 1:  # all repeats alike: say it once
            runs = words[0] + (f" (x{repeats})" if repeats > 1 else "")
        else:
            runs = ", ".join(f"r{k}: {w}" for k, w in enumerate(words))
        g.rows.append([str(i), p.id, axes_text(p.axes), runs])
    return g


__all__ = ["axes_text", "run_label", "run_line", "threads_text", "threads_line", "results_table", "flag_lines", "plan_table"]
