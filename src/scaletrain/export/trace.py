"""One Chrome/Perfetto trace of all ranks on one clock, built from the metrics files (pure + one writer).

Open trace.json in https://ui.perfetto.dev or chrome://tracing. Each rank is a process; each phase is
a thread (track) of it, plus a `step` track and a `comm` track with every bucket's reduction. Within a
step, phases are laid out in their natural order (data_wait, h2d, forward, backward, comm_exposed,
optimizer, other); `other` collects the small gaps of the step and is drawn at its end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scaletrain.analysis.timeline import PHASES, PIPELINE_PHASES, SPATIAL_PHASES, phase_names

TRACKS = ("step", *PHASES[:-1], *PIPELINE_PHASES, *SPATIAL_PHASES, PHASES[-1], "comm")


def trace_events(records_by_rank: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """The trace as a dict (Chrome trace event format, times in microseconds from the first step)."""
    starts = [r["t_start_s"] for recs in records_by_rank.values() for r in recs if "t_start_s" in r]
    origin = min(starts) if starts else 0.0
    events: list[dict[str, Any]] = []
    for rank, records in sorted(records_by_rank.items()):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}})
        for tid, track in enumerate(TRACKS):
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": track}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid,
                           "args": {"sort_index": tid}})
        for r in records:
            if "phases_s" not in r:
                continue
            t0 = (r["t_start_s"] - origin) * 1e6
            args = {"step": r["step"], "epoch": r.get("epoch"), "loss": r.get("loss")}
            events.append(_span("step", rank, 0, t0, r["step_time_s"] * 1e6, args))
            t = t0
            for phase in phase_names(r["phases_s"]):
                tid = TRACKS.index(phase)
                duration = r["phases_s"][phase] * 1e6
                if duration > 0:
                    events.append(_span(phase, rank, tid, t, duration, {"step": r["step"]}))
                t += duration
            for begin, end in r.get("comm_intervals_s", []):
                events.append(_span("bucket reduction", rank, len(TRACKS) - 1, t0 + begin * 1e6,
                                    (end - begin) * 1e6, {"step": r["step"]}))
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"origin_unix_s": origin}}


def _span(name: str, pid: int, tid: int, ts: float, dur: float, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": round(ts, 3), "dur": round(dur, 3), "args": args}


def write_trace(records_by_rank: dict[int, list[dict[str, Any]]], path: Path) -> Path:
    from scaletrain.rundir import replace_atomic

    events = trace_events(records_by_rank)
    replace_atomic(path, lambda f: json.dump(events, f, separators=(",", ":")), mode="w")
    return path
