"""What a run directory says about its run right now: progress, throughput, phases, status (pure).

`Observed` is what was read from the files (by watch/reader.py); `snapshot` turns it, with the
analysis of each rank's recent steps (analysis.analyze_run), into the numbers a view shows.
Definitions: docs/watch.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import takewhile
from typing import Any

from scaletrain.analysis import RUN_FACTS, analyze_run
from scaletrain.analysis.throughput import settled_at, settled_step, warmup_steps
from scaletrain.config import layout_of
from scaletrain.config.applies import defaults

POSITIONS = warmup_steps(1 << 30) + 1  # steps in an epoch that may be warm-up, then all the others together
RECENT = 50  # steps of the primary rank behind the "recent" samples/s, step time and the ETA
STALE_MIN_S = 120.0  # never call a run stalled sooner than this
ENDED_AFTER_S = 1.0  # a step written this long after summary.json: the run was resumed and is running again


@dataclass(frozen=True, slots=True)
class Step:
    """What progress and throughput need of one of the primary rank's steps (kept for every step)."""

    step: int
    epoch: int
    step_in_epoch: int
    samples: int
    step_time_s: float
    samples_per_s: float | None  # global, as recorded with the profiler on
    t_start_s: float | None  # unix seconds, as recorded with the profiler on
    epoch_steps: int | None = None  # the run's steps per epoch, as the trainer records it with every step
    fresh_pages: int | None = None  # pages the rank took from the kernel in the step (analysis/throughput.py)


@dataclass
class Observed:
    """A run directory as read now."""

    root: str
    config: dict[str, Any]  # config.toml ({} before it is written)
    summary: dict[str, Any] | None  # summary.json, None while there is none
    summary_mtime: float | None
    last_write: float | None  # newest modification time of the metrics files: the last steps written
    launched: float | None  # when config.toml was written
    primary: int | None  # the lowest rank with a metrics file: progress and throughput are its
    steps: list[Step]  # every step of the primary rank
    windows: dict[int, list[dict[str, Any]]]  # each rank's last `window` step records
    window: int  # steps per rank kept for the analysis (0: all)
    window_full: bool  # some rank has recorded more steps than the window holds
    epochs: list[dict[str, Any]] = field(default_factory=list)  # epochs.jsonl
    # [samples, seconds] of the primary's steps by position in their epoch: 0 .. POSITIONS-2, then the rest
    sums_by_position: list[list[float]] = field(default_factory=lambda: [[0, 0.0] for _ in range(POSITIONS)])
    longest_epoch: int = 0  # most steps the primary recorded in one epoch
    longest_pause_s: float = 0.0  # the primary's longest time between the end of a step and the next's start
    settled: int | None = None  # the step the heap settled at (heap_settled; computed when new steps arrive)
    restarts: int | None = None  # restarts.jsonl's failures the workers were restarted from (None: no file)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Progress:
    epoch: int  # the epoch of the last step, from 1
    epochs: int | None  # planned
    steps_done: int  # global steps, the last recorded one included
    steps_total: int | None  # None until the steps per epoch are known
    steps_per_epoch: int | None
    fraction: float | None
    eta_s: float | None


@dataclass
class Snapshot:
    """Everything a frame shows (docs/watch.md); `None` means not measured (yet), never 0."""

    root: str
    title: str
    status: str  # waiting, running, stalled, or summary.json's: completed, stopped, preempted, failed, ...
    detail: str | None  # the error of a failed run, why a run looks stalled, ...
    ended: bool
    age_s: float | None  # since the last steps were written
    restarts: int | None
    progress: Progress | None
    samples_per_s_recent: float | None
    samples_per_s_mean: float | None
    mean_source: str | None
    step_time_recent_s: float | None
    recent_steps: int
    phases: tuple[str, ...]
    ranks: list[dict[str, Any]]  # analysis' per-rank stats (phases_mean_s, step_time_*_s, slowest_share)
    run_phases: dict[str, float] | None  # mean over ranks
    step_time_mean_s: float | None
    stragglers: dict[str, Any] | None
    diagnosis: list[dict[str, Any]]
    window: int
    window_full: bool
    notes: list[str]
    taken_at: float  # unix seconds


def analysis_config(obs: Observed) -> dict[str, Any]:
    """config.toml, with where the run sat once the summary says it (the CPU checks need it)."""
    placement = {k: obs.summary[k] for k in RUN_FACTS if obs.summary and obs.summary.get(k) is not None}
    return {**obs.config, **placement}


def analyze(obs: Observed) -> dict[str, Any] | None:
    """analysis.analyze_run over each rank's recent steps (None before the first step)."""
    records = {rank: recs for rank, recs in obs.windows.items() if recs}
    return analyze_run(records, analysis_config(obs)) if records else None


def steps_per_epoch(steps: list[Step], summary: dict[str, Any] | None) -> int | None:
    """As the trainer records it with each step; for older runs, from the last complete epoch the primary recorded (the last one too once the run has completed),
    else from where a later epoch starts, else from summary.json."""
    if not steps:
        return None
    last = steps[-1]
    if last.epoch_steps:
        return int(last.epoch_steps)
    complete = last.epoch if (summary or {}).get("status") == "completed" else last.epoch - 1
    if complete >= 0:
        seen = []  # step_in_epoch of the complete epoch's steps, read from the end
        for s in reversed(steps):
            if s.epoch < complete:
                break
            if s.epoch == complete:
                seen.append(s.step_in_epoch)
        if seen and min(seen) == 0:
            return max(seen) + 1
    if last.epoch > 0 and (last.step - last.step_in_epoch) % last.epoch == 0:
        return (last.step - last.step_in_epoch) // last.epoch
    start = (summary or {}).get("epoch_start") or {}
    return _int(start.get("steps_per_epoch"))


def progress(obs: Observed, spe: int | None, recent_step_s: float | None, ended: bool) -> Progress | None:
    if not obs.steps:
        return None
    last = obs.steps[-1]
    epochs = _int(obs.config.get("epochs")) or _int((obs.summary or {}).get("epochs_planned"))
    total = None
    if spe and epochs:
        # where the current epoch started + the epochs left (at the steps per epoch of the last complete one)
        total = max(last.step + 1, last.step - last.step_in_epoch + (epochs - last.epoch) * spe)
    done = last.step + 1
    fraction = min(1.0, done / total) if total else None
    eta = None
    if total and recent_step_s is not None and not ended:
        eta = max(0, total - done) * recent_step_s
    return Progress(epoch=last.epoch + 1, epochs=epochs, steps_done=done, steps_total=total,
                    steps_per_epoch=spe, fraction=fraction, eta_s=eta)


def replicas(steps: list[Step], config: dict[str, Any]) -> int:
    """Ranks that read different data: from a step's global samples/s, else from the configuration."""
    for s in reversed(steps):
        if s.samples_per_s and s.samples and s.step_time_s > 0:
            return max(1, round(s.samples_per_s * s.step_time_s / s.samples))
    layout = layout_of(config)  # (before the first step's rate: the configuration's, config/layout.py)
    return max(1, layout.replicas) if layout is not None else 1


def recent_throughput(steps: list[Step], config: dict[str, Any]) -> tuple[float | None, float | None]:
    """(global samples/s, mean step time) over the primary rank's last RECENT steps."""
    recent = steps[-RECENT:]
    seconds = sum(s.step_time_s for s in recent)
    if not recent or seconds <= 0:
        return None, None
    if all(s.samples_per_s is not None for s in recent):
        samples = sum(s.samples_per_s * s.step_time_s for s in recent)
    else:
        samples = sum(s.samples for s in recent) * replicas(steps, config)
    return samples / seconds, seconds / len(recent)


def mean_throughput(obs: Observed, spe: int | None, ended: bool) -> tuple[float | None, str | None]:
    """summary.json's steady-state samples/s once the run has ended, else the same definition
    (analysis.throughput: sum(samples) x replicas / sum(step time) over steady steps) over the steps so far."""
    if ended and obs.summary and obs.summary.get("samples_per_s"):
        return float(obs.summary["samples_per_s"]), "summary.json"
    if not obs.steps:
        return None, None
    skip = warmup_steps(spe or obs.longest_epoch)
    samples = sum(n for n, _ in obs.sums_by_position[skip:])
    seconds = sum(t for _, t in obs.sums_by_position[skip:])
    if obs.settled is not None:  # and not before the heap settled
        early = [s for s in takewhile(lambda s: s.step < obs.settled, obs.steps) if s.step_in_epoch >= skip]
        samples -= sum(s.samples for s in early)
        seconds -= sum(s.step_time_s for s in early)
    if seconds <= 0:
        return None, None
    return samples * replicas(obs.steps, obs.config) / seconds, "steady steps so far"


def heap_settled(steps: list[Step], windows: dict[int, list[dict[str, Any]]], window_full: bool) -> int | None:
    """The step from which the run's heap had settled (analysis/throughput.py): every rank's while the windows
    hold all their steps, the primary's alone once the others' first steps are out of reach."""
    if not window_full:
        return settled_step(windows)
    return settled_at([(s.step, s.fresh_pages) for s in steps if s.fresh_pages is not None])


def stale_after(obs: Observed, recent_step_s: float | None) -> float:
    """How long without a new step before a running run is called stalled: STALE_MIN_S, or 3 x the
    longest pause between two of its steps so far (evaluation, checkpoints), or 100 steps, if longer."""
    return max(STALE_MIN_S, 3 * obs.longest_pause_s, 100 * (recent_step_s or 0.0))


def status(obs: Observed, now: float, stale_s: float) -> tuple[str, str | None, bool]:
    """(status, detail, ended)."""
    resumed = (obs.summary is not None and obs.last_write is not None and obs.summary_mtime is not None
               and obs.last_write > obs.summary_mtime + ENDED_AFTER_S)
    if obs.summary is not None and not resumed:
        return str(obs.summary.get("status") or "ended"), obs.summary.get("error"), True
    if not obs.steps:
        return "waiting", (f"config.toml written {ago(now - obs.launched)} ago" if obs.launched else None), False
    age = now - obs.last_write if obs.last_write else 0.0
    if age > stale_s:
        return "stalled", (f"no new step for {ago(age)} (more than {ago(stale_s)}): the run may have hung or "
                           "died; look at its job or its errors/ folder"), False
    if resumed:
        return "running", "resumed after summary.json was written", False
    return "running", None, False


def snapshot(obs: Observed, analysis: dict[str, Any] | None, now: float, stale_s: float | None = None) -> Snapshot:
    """The frame's numbers from what was read and the analysis of the recent steps."""
    recent_sps, recent_step = recent_throughput(obs.steps, obs.config)
    spe = steps_per_epoch(obs.steps, obs.summary)
    limit = stale_s if stale_s is not None else stale_after(obs, recent_step)
    state, detail, ended = status(obs, now, limit)
    mean_sps, source = mean_throughput(obs, spe, ended)
    prog = progress(obs, spe, recent_step, ended)
    if state == "running" and detail is None and prog is not None and prog.fraction == 1.0:
        detail = "every step done: evaluating, checkpointing, writing summary.json"
    restarts = (obs.summary or {}).get("restarts") if ended else None
    ranks = (analysis or {}).get("ranks") or []
    run_phases = (analysis or {}).get("phases_mean_s")
    names = tuple(run_phases) if run_phases else ()
    return Snapshot(
        root=obs.root, title=title(obs), status=state, detail=detail, ended=ended,
        age_s=now - obs.last_write if obs.last_write and obs.steps else None,
        restarts=len(restarts) if isinstance(restarts, list) else obs.restarts,
        progress=prog, samples_per_s_recent=recent_sps, samples_per_s_mean=mean_sps, mean_source=source,
        step_time_recent_s=recent_step, recent_steps=min(RECENT, len(obs.steps)),
        phases=names, ranks=ranks, run_phases=run_phases,
        step_time_mean_s=(analysis or {}).get("step_time_mean_s"),
        stragglers=(analysis or {}).get("stragglers"), diagnosis=(analysis or {}).get("diagnosis") or [],
        window=obs.window, window_full=obs.window_full, notes=list(obs.notes), taken_at=now)


def title(obs: Observed) -> str:
    """`lenet5 on digits, allreduce, 2 ranks (cpu)`."""
    c, s = obs.config, obs.summary or {}
    if not c and not s:
        return "(no config.toml yet)"
    layout = layout_of(c) if c else None
    world = layout.world if layout is not None else s.get("world_size")
    device = s.get("device") or c.get("device")
    where = f" ({device})" if device and device != "auto" else ""
    ranks = f"{world} rank{'s' if world != 1 else ''}" if world else "ranks unknown"
    return (f"{c.get('model') or s.get('model')} on {c.get('dataset') or s.get('dataset')}, "
            f"{c.get('strategy') or defaults()['strategy']}, {ranks}{where}")


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def ago(seconds: float) -> str:
    """`42 s`, `5 min 3 s`, `2 h 10 min`."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
