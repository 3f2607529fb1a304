"""Rendering for people: the end-of-run summary and the model listing (tables; no computation)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from scaletrain.console.width import output_console
from scaletrain import fmt
from scaletrain.grid import Grid, rich_table
from scaletrain.rundir import RunDir, read_summary


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def epoch_line(record: dict[str, Any], epochs: int) -> str:
    """One line per epoch for the log: time, training loss, validation accuracy when measured."""
    acc = f"  top1 {record['top1']:.4f}  top5 {record['top5']:.4f}" if "top1" in record else ""
    return (f"epoch {record['epoch'] + 1}/{epochs}  {record['epoch_time_s']:.1f} s"
            f"  loss {record['train_loss']:.4f}{acc}")


def summary_table(s: dict[str, Any], replicas: int | None = None) -> Grid:
    """replicas: the ranks that share the global batch (the layout's; a parameter server's servers take none)."""
    times = s.get("epoch_times_s") or []
    world, replicas = s["world_size"], replicas or s["world_size"]
    of = f"of {world} ranks; " if replicas != world else ""
    rows = [
        ("ranks x batch", f"{replicas} x {s['global_batch'] // replicas} = {s['global_batch']} "
                          f"({of}{s['device']}, {s['backend']}, {s['precision']})"),
        ("epochs", f"{s['epochs']}/{s['epochs_planned']}"),
        ("top-1 / best / top-5", f"{_pct(s['top1'])} / {_pct(s['best_top1'])} / {_pct(s['top5'])}"),
        ("epoch time (mean)", f"{sum(times) / len(times):.2f} s" if times else "-"),
        ("throughput (steady)", fmt.rate(s["samples_per_s"], "samples") + steady_steps(s.get("steady"))
         if s.get("samples_per_s") is not None
         else "none: too short for a steady state (each epoch's first steps are warm-up)"),
        ("effective lr", f"{s['effective_lr']:.4g}"),
        ("wall time", f"{s['wall_time_s']:.1f} s"),
    ]
    if s.get("peak_memory_bytes"):
        kind = "GPU memory allocated" if s.get("memory_kind") == "cuda" else "resident set size"
        rows.append(("peak memory (max rank)", f"{s['peak_memory_bytes'] / 2**20:,.0f} MiB ({kind})"))
    ps = s.get("ps")
    if ps:
        rows.append(("parameter server", ps_line(ps)))
    if s.get("bad_images_skipped"):
        rows.append(("unreadable images skipped", str(s["bad_images_skipped"])))
    return Grid(f"{s['model']} on {s['dataset']}: {s['status']}", ["", ""], [list(r) for r in rows], header=False,
                text_columns=(0, 1))


def steady_steps(steady: dict[str, Any] | None) -> str:
    """` over 20 of 24 steps (the heap took fresh memory for the first 3)`: what the steady means rest on
    (docs/metrics.md)."""
    if not steady or not steady.get("of"):
        return ""
    warm = steady.get("heap_warm_steps")
    return f" over {steady['steps']} of {steady['of']} steps" + (
        f" (the heap took fresh memory for the first {warm})" if warm else "")


def warm_up_line(s: dict[str, Any]) -> str | None:
    """A warning when the run ended before its heap had long settled (its steady means rest on few steps)."""
    steady = s.get("steady") or {}
    if not steady.get("heap_settled_late"):
        return None
    return (f"warning: the heap took fresh memory from the kernel for {steady['heap_warm_steps']} of the run's "
            f"{steady['of']} steps: the steady means rest on {steady['steps']}; train more steps (more samples or "
            "epochs) for firm ones")


def ps_line(ps: dict[str, Any]) -> str:
    """`ps-async: 1 server, 3 workers (1 died: rank 1); staleness mean 1.17, p90 2, max 11; 0 dropped`."""
    dead = ps.get("dead_workers") or []
    died = f" ({len(dead)} died: rank {', '.join(str(d['rank']) for d in dead)})" if dead else ""
    text = f"{ps['mode']}: {ps['servers']} server{'s' if ps['servers'] > 1 else ''}, {ps['workers']} workers{died}"
    st = ps.get("staleness") or {}
    if ps.get("asynchronous") and st.get("pushes"):
        text += f"; staleness mean {st['mean']:.2f}, p90 {st['p90']}, max {st['max']}; {ps['dropped_stale']} dropped"
    return text


def phases_line(s: dict[str, Any]) -> str | None:
    """`a step (41.2 ms): data_wait 3.1 ms (8%) | ...` from summary.json's phases_mean_s."""
    phases, step = s.get("phases_mean_s"), s.get("step_time_mean_s")
    if not phases or not step:
        return None
    parts = " | ".join(f"{k} {v * 1000:.1f} ms ({v / step:.0%})" for k, v in phases.items() if v / step >= 0.005)
    overlap = s.get("overlap_ratio")
    hidden = f"; communication hidden behind backward: {overlap:.0%}" if overlap is not None else ""
    return f"a step ({step * 1000:.1f} ms, mean over ranks): {parts}{hidden}"


def diagnosis_lines(s: dict[str, Any]) -> list[str]:
    return [f"{f['kind']}: {f['message']}\n    -> {f['lever']}" for f in s.get("diagnosis") or []]


def print_summary(run: RunDir, replicas: int | None = None, console: Console | None = None) -> None:
    console = console or output_console()
    s = read_summary(run.root, strict=False)
    if s is None:
        console.print(f"run directory: {run.root}  (no readable summary.json: the run did not finish)")
        return
    console.print(rich_table(summary_table(s, replicas)))
    line = phases_line(s)
    if line:
        console.print(line, highlight=False)
    for text in diagnosis_lines(s):
        console.print(f"diagnosis: {text}", highlight=False)
    warning = warm_up_line(s)
    if warning:
        console.print(warning, highlight=False)
    console.print(f"run directory: {run.root}  (summary.json, metrics-rank*.jsonl, checkpoint.pt)")
    if s.get("phases_mean_s"):
        console.print(f"plots and report: scaletrain report {run.root}   timeline: {run.root / 'trace.json'} "
                      "(open in ui.perfetto.dev)", highlight=False)


def print_models(rows: list[dict[str, Any]], image_size: int, console: Console | None = None) -> None:
    cells = [[r["name"], r["description"], f"{r['params']:,}",
              f"{r['flops'] / 1e9:.3f}" if r.get("flops") is not None else (r.get("note") or "-")] for r in rows]
    t = rich_table(Grid(f"models at {image_size}x{image_size}", ["model", "description", "parameters",
                                                                 "forward GFLOPs"], cells, text_columns=(0, 1)))
    console = console or output_console()
    console.print(t)
    console.print("any other model: --model package.module:factory")
