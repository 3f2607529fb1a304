"""A snapshot as rich renderables: the frame `scaletrain watch` refreshes (and html.py exports)."""

from __future__ import annotations

import time

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from scaletrain import fmt
from scaletrain.grid import Grid, rich_table
from scaletrain.watch.state import Snapshot, ago

STYLES = {"running": "bold green", "completed": "bold blue", "waiting": "bold cyan", "stalled": "bold red",
          "failed": "bold red", "stopped": "bold yellow", "preempted": "bold yellow"}


def frame(s: Snapshot, hint: str = "") -> RenderableType:
    """Header, progress and throughput; then the phases per rank, stragglers, diagnosis and notes."""
    parts: list[RenderableType] = [header(s)]
    if s.progress is not None:
        parts += [phase_table(s), stragglers(s), diagnosis(s)]
    if s.notes:
        parts.append(Text("\n".join(f"note: {n}" for n in s.notes), style="dim"))
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.taken_at))
    parts.append(Text(f"read at {when}{hint}", style="dim"))
    return Group(*parts)


def header(s: Snapshot) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    state = Text(s.status, style=STYLES.get(s.status, "bold"))
    if s.age_s is not None and not s.ended:
        state.append(f"   last steps written {ago(s.age_s)} ago", style="dim")
    grid.add_row("status", state)
    if s.detail:
        grid.add_row("", Text(s.detail, style="red" if s.status in ("failed", "stalled") else ""))
    if s.restarts is not None:
        grid.add_row("restarts", str(s.restarts))
    p = s.progress
    if p is None:
        grid.add_row("progress", "no step was recorded" if s.ended else "waiting for the first step")
    else:
        grid.add_row("progress", progress_line(s))
        if p.fraction is not None:
            grid.add_row("", ProgressBar(total=1.0, completed=p.fraction, width=50))
        grid.add_row("samples/s", throughput_line(s))
    return Panel(grid, title=f"[bold]scaletrain watch[/] {s.root}", subtitle=s.title, title_align="left",
                 subtitle_align="left")


def progress_line(s: Snapshot) -> str:
    """`epoch 2/4  step 24/48  50.0%  ETA 12 s`."""
    p = s.progress
    epochs = f"/{p.epochs}" if p.epochs else ""
    total = f"/{p.steps_total}" if p.steps_total else " (of ? until the first epoch ends)"
    pct = f"  {100 * p.fraction:.1f}%" if p.fraction is not None else ""
    eta = f"  ETA {ago(p.eta_s)}" if p.eta_s is not None else ""
    return f"epoch {p.epoch}{epochs}  step {p.steps_done}{total}{pct}{eta}"


def throughput_line(s: Snapshot) -> str:
    recent = (f"{fmt.number(s.samples_per_s_recent)} recent (last {s.recent_steps} steps, "
              f"{fmt.ms(s.step_time_recent_s)} per step)") if s.samples_per_s_recent is not None else "recent: not measured"
    mean = (f"{fmt.number(s.samples_per_s_mean)} mean ({s.mean_source})" if s.samples_per_s_mean is not None
            else "mean: no steady-state step yet")
    return f"{recent}   {mean}"


def phase_table(s: Snapshot) -> Table | Text:
    """Mean milliseconds per phase and rank over steady steps, a mean row and each phase's share."""
    span = f"the last {s.window} steps of each rank" if s.window_full else "all steps so far"
    rows = [[str(r["rank"]), str(r["steps"]), fmt.ms(r["step_time_mean_s"], unit=False),
             *(fmt.ms((r.get("phases_mean_s") or {}).get(name), unit=False) for name in s.phases),
             fmt.ms(r["step_time_p90_s"], unit=False),
             "-" if r.get("slowest_share") is None else f"{r['slowest_share']:.0%}"] for r in s.ranks]
    foot = []
    if s.run_phases and s.step_time_mean_s:
        foot = [["mean", "", fmt.ms(s.step_time_mean_s, unit=False),
                 *(fmt.ms(s.run_phases[name], unit=False) for name in s.phases), "", ""],
                ["share", "", "100%", *(f"{s.run_phases[name] / s.step_time_mean_s:.0%}" for name in s.phases),
                 "", ""]]
    note = None
    if not s.ranks:
        note = "no steady-state step yet (the first steps of each epoch are warm-up)"
    elif not s.phases:
        note = "not profiled (--profile off): step times only"
    return rich_table(Grid(f"phases per rank, ms (mean over the steady steps of {span})",
                           ["rank", "steps", "step", *s.phases, "p90", "slowest"], rows, note=note,
                           text_columns=(), foot=foot, open=True))


def stragglers(s: Snapshot) -> Text:
    st = s.stragglers or {}
    if len(s.ranks) < 2:
        return Text("stragglers: one rank, nothing to compare", style="dim")
    if not st.get("steps_compared"):
        return Text("stragglers: no step recorded by every rank yet", style="dim")
    text = Text("stragglers: ", style="bold")
    counts = ", ".join(f"rank {r} {c}" for r, c in st["slowest_counts"].items())
    text.append(f"slowest in {st['steps_compared']} steps compared: {counts}; spread of work across ranks "
                f"{fmt.ms(st['spread_mean_s'])} per step")
    for r in st.get("repeated") or []:
        text.append(f"\n  rank {r['rank']} is repeatedly the slowest: {r['share']:.0%} of steps, "
                    f"{fmt.ms(r['lag_mean_s'])} behind the others on average", style="yellow")
    return text


def diagnosis(s: Snapshot) -> Text:
    if not s.diagnosis:
        why = "the run is not profiled (--profile off)" if s.ranks and not s.phases else \
            "none yet (it needs steady-state steps)"
        return Text(f"diagnosis: {why}", style="dim")
    text = Text("diagnosis so far:", style="bold")
    for f in s.diagnosis:
        text.append(f"\n  {f['kind']}", style="bold yellow" if f["kind"] != "compute-bound" else "bold")
        text.append(f": {f['message']}\n      -> {f['lever']}")
    return text
