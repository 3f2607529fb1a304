"""A pipeline run's stages from its metrics files (docs/metrics.md, "Pipeline stages"): each stage's phases and
its measured bubble fraction beside theory's (K-1)/(M+K-1), and one step's spans on a common clock for the
per-stage timeline. Data only; report/ draws it.
"""

from __future__ import annotations

from statistics import median
from typing import Any

from scaletrain.analysis.steps import steady as steady_steps
from scaletrain.analysis.throughput import settled_step

STAGE_PHASES = ("forward", "backward", "bubble", "p2p")
"""The phases a stage's row shows; the rest of the step (data, optimizer, other) is `rest`."""


def _steady(records: list[dict[str, Any]], settled: int | None) -> list[dict[str, Any]]:
    """Records with phases, steady (analysis/throughput.py; all of them when none is)."""
    profiled = [r for r in records if r.get("phases_s")]
    return steady_steps(profiled, settled) or profiled


def stage_rows(pipeline: dict[str, Any], records_by_rank: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per rank: its stage and replica (rank = replica x K + stage), its blocks, the mean seconds per
    steady step of each STAGE_PHASES and of the step, and the bubble fraction (bubble / step) beside theory."""
    k = int(pipeline.get("stages") or 1)
    names = pipeline.get("stage_blocks") or []
    theory = pipeline.get("bubble_theory")
    rows, settled = [], settled_step(records_by_rank)
    for rank in sorted(records_by_rank):
        steady = _steady(records_by_rank[rank], settled)
        if not steady:
            continue
        n = len(steady)
        step = sum(r["step_time_s"] for r in steady) / n
        phases = {p: sum(r["phases_s"].get(p, 0.0) for r in steady) / n for p in STAGE_PHASES}
        stage = rank % k
        rows.append({"rank": rank, "stage": stage, "replica": rank // k,
                     "blocks": names[stage] if stage < len(names) else [], "steps": n, "step_s": step,
                     "phases_s": phases, "rest_s": max(0.0, step - sum(phases.values())),
                     "bubble_fraction": phases["bubble"] / step if step > 0 else None, "bubble_theory": theory})
    return rows


def timeline_step(records_by_rank: dict[int, list[dict[str, Any]]]) -> int | None:
    """The step the timeline shows: of the steady steps every rank recorded spans for, the one whose slowest
    rank's step time is the median (a typical step, not the first or an outlier)."""
    settled = settled_step(records_by_rank)
    by_rank = {rank: {r["step"]: r for r in _steady(recs, settled) if r.get("spans_s")}
               for rank, recs in records_by_rank.items()}
    if not by_rank or not all(by_rank.values()):
        return None
    common = set.intersection(*(set(steps) for steps in by_rank.values()))
    if not common:
        return None
    slowest = sorted((max(by_rank[rank][s]["step_time_s"] for rank in by_rank), s) for s in common)
    return slowest[len(slowest) // 2][1]


def timeline(records_by_rank: dict[int, list[dict[str, Any]]], step: int | None = None
             ) -> tuple[int, dict[int, list[tuple[str, float, float]]]] | None:
    """(step, per rank its spans as (phase, begin s, end s)) on one clock: seconds from the earliest rank's
    start of that step (`t_start_s` is on rank 0's clock). None when the records hold no spans."""
    step = timeline_step(records_by_rank) if step is None else step
    if step is None:
        return None
    found = {rank: next((r for r in recs if r["step"] == step and r.get("spans_s")), None)
             for rank, recs in records_by_rank.items()}
    found = {rank: r for rank, r in found.items() if r is not None}
    if not found:
        return None
    origin = min(r["t_start_s"] for r in found.values())
    return step, {rank: [(name, r["t_start_s"] - origin + a, r["t_start_s"] - origin + b)
                         for name, a, b in r["spans_s"]] for rank, r in sorted(found.items())}


def bubble_summary(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The measured bubble fraction over the stages (median, least, most) beside theory."""
    fractions = [r["bubble_fraction"] for r in rows if r["bubble_fraction"] is not None]
    if not fractions:
        return None
    return {"median": median(fractions), "min": min(fractions), "max": max(fractions),
            "theory": rows[0]["bubble_theory"]}
