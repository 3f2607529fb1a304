"""Per-rank and per-run statistics over recorded steps (pure functions over metrics records)."""

from __future__ import annotations

from statistics import mean
from typing import Any

import numpy as np

from scaletrain.analysis.throughput import heap_settled_step, is_steady, settled_step, warmup_steps
from scaletrain.analysis.timeline import PHASES, phase_names

Records = list[dict[str, Any]]


def steady(records: Records, settled: int | None = None) -> Records:
    """Steps outside each epoch's warm-up (the first min(5, steps_per_epoch // 4) steps of every epoch) and not
    before step `settled`, the run's `throughput.settled_step` (default: this rank's heap's own)."""
    if not records:
        return []
    if "step_in_epoch" in records[0]:
        skip = warmup_steps(max(r["step_in_epoch"] for r in records) + 1)
        settled = heap_settled_step(records) if settled is None else settled
        return [r for r in records if is_steady(r, skip, settled)]
    return records[warmup_steps(len(records)):]  # a loop without epochs: warm-up at the start only


def steady_span(records_by_rank: dict[int, Records], steady_by_rank: dict[int, Records],
                settled: int | None) -> dict[str, Any]:
    """What the steady means rest on: `steps` (the fewest any rank kept) `of` its steps; the step its heap
    settled at (`heap_settled_step`, as `step` counts; None when not recorded), the run's steps before it
    (`heap_warm_steps`) and whether they were more than half the run (`heap_settled_late`: too short a run
    for its model's warm-up)."""
    total = max((len(recs) for recs in records_by_rank.values()), default=0)
    first = min((r["step"] for recs in records_by_rank.values() for r in recs[:1]), default=0)
    warm = None if settled is None else settled - first
    return {"steps": min((len(recs) for recs in steady_by_rank.values()), default=0), "of": total,
            "heap_settled_step": settled, "heap_warm_steps": warm,
            "heap_settled_late": warm is not None and 2 * warm > total}


def has_phases(records: Records) -> bool:
    return bool(records) and "phases_s" in records[0]


def rank_stats(rank: int, records: Records) -> dict[str, Any]:
    """One rank's mean phases and step-time distribution over its steady steps."""
    times = np.array([r["step_time_s"] for r in records], dtype=float)
    stats: dict[str, Any] = {"rank": rank, "steps": len(records)}
    if has_phases(records):
        stats["phases_mean_s"] = {k: mean(r["phases_s"].get(k, 0.0) for r in records)
                                  for k in phase_names(records[0]["phases_s"])}
    else:
        stats["phases_mean_s"] = None
    stats |= {
        "step_time_mean_s": float(times.mean()),
        "step_time_p50_s": float(np.percentile(times, 50)),
        "step_time_p90_s": float(np.percentile(times, 90)),
        "step_time_max_s": float(times.max()),
    }
    return stats


def run_means(steady_by_rank: dict[int, Records]) -> dict[str, Any]:
    """Means over ranks of the per-rank means; overlap ratio over all communication of all ranks."""
    per_rank = [rank_stats(r, recs) for r, recs in sorted(steady_by_rank.items()) if recs]
    if not per_rank:
        return {"phases_mean_s": None, "step_time_mean_s": None, "overlap_ratio": None, "comm_total_mean_s": None,
                "comm_hidden_mean_s": None, "bytes_sent_per_step": None, "ranks": []}
    result: dict[str, Any] = {"step_time_mean_s": mean(s["step_time_mean_s"] for s in per_rank)}
    all_steps = [r for recs in steady_by_rank.values() for r in recs]
    if all(s["phases_mean_s"] is not None for s in per_rank):
        result["phases_mean_s"] = {k: mean(s["phases_mean_s"].get(k, 0.0) for s in per_rank)
                                   for k in phase_names(per_rank[0]["phases_mean_s"])}
        total = sum(r["comm_total_s"] for r in all_steps)
        hidden = sum(r["comm_hidden_s"] for r in all_steps)
        result |= {
            "overlap_ratio": hidden / total if total > 0 else None,  # no communication: nothing to overlap
            "comm_total_mean_s": total / len(all_steps),
            "comm_hidden_mean_s": hidden / len(all_steps),
            "bytes_sent_per_step": mean(r["bytes_sent"] for r in all_steps),
        }
        if all("bytes_uncompressed" in r for r in all_steps) and result["bytes_sent_per_step"]:
            raw = mean(r["bytes_uncompressed"] for r in all_steps)
            # what a plain all-reduce of the same gradients would send / what was sent
            result["compression_ratio"] = raw / result["bytes_sent_per_step"]
    else:
        result |= {"phases_mean_s": None, "overlap_ratio": None, "comm_total_mean_s": None,
                   "comm_hidden_mean_s": None, "bytes_sent_per_step": None}
    result["ranks"] = per_rank
    return result


def epoch_start_wait(records_by_rank: dict[int, Records]) -> dict[str, Any] | None:
    """Extra data wait of each epoch's first step (loader workers starting, first batch), over the steady mean.

    Steady-state means leave the first steps of an epoch out; this is what they leave out for data.
    None when there are no epochs or no phases.
    """
    extras, steps_per_epoch, settled = [], [], settled_step(records_by_rank)
    for records in records_by_rank.values():
        if not has_phases(records) or "step_in_epoch" not in records[0]:
            return None
        kept = steady(records, settled)
        if not kept:
            return None
        base = mean(r["phases_s"]["data_wait"] for r in kept)
        extras += [max(0.0, r["phases_s"]["data_wait"] - base) for r in records if r["step_in_epoch"] == 0]
        steps_per_epoch.append(max(r["step_in_epoch"] for r in records) + 1)
    if not extras:
        return None
    return {"wait_mean_s": mean(extras), "steps_per_epoch": max(steps_per_epoch)}
