"""Which rank holds the others back, step by step and over the run (pure functions).

A rank's *work* in a step is its step time less the time it waited for its peers' gradients
(exposed communication): the slowest rank arrives last at the all-reduce and waits least.
"""

from __future__ import annotations

from statistics import mean, median
from typing import Any

Records = list[dict[str, Any]]


def work(record: dict[str, Any]) -> float:
    phases = record.get("phases_s")
    return record["step_time_s"] - (phases["comm_exposed"] if phases else 0.0)


def slowest_by_step(steady_by_rank: dict[int, Records]) -> list[tuple[int, int, float]]:
    """(step, slowest rank, lag) for every step all ranks recorded; lag = its work - median of the others'."""
    by_step: dict[int, dict[int, float]] = {}
    for rank, records in steady_by_rank.items():
        for r in records:
            by_step.setdefault(r["step"], {})[rank] = work(r)
    ranks = len(steady_by_rank)
    rows = []
    for step in sorted(by_step):
        works = by_step[step]
        if len(works) < ranks or ranks < 2:
            continue
        slow = max(works, key=works.get)
        rows.append((step, slow, works[slow] - median(w for r, w in works.items() if r != slow)))
    return rows


def straggler_stats(steady_by_rank: dict[int, Records], step_time_mean_s: float | None,
                    threshold: float) -> dict[str, Any]:
    """Slowest counts per rank, spread of work across ranks, and the ranks that are repeatedly last.

    Repeatedly last: slowest in at least max(50%, 1.5 / ranks) of the steps, by a mean lag of at least
    `threshold` x the mean step time.
    """
    rows = slowest_by_step(steady_by_rank)
    ranks = len(steady_by_rank)
    if not rows:
        return {"steps_compared": 0, "spread_mean_s": None, "slowest_counts": {}, "repeated": [], "worst_steps": []}
    counts: dict[int, int] = {}
    lags: dict[int, list[float]] = {}
    for _, rank, lag in rows:
        counts[rank] = counts.get(rank, 0) + 1
        lags.setdefault(rank, []).append(lag)
    works = {}
    for rank, records in steady_by_rank.items():
        for r in records:
            works.setdefault(r["step"], []).append(work(r))
    spread = mean(max(w) - min(w) for w in works.values() if len(w) == ranks)
    need_share = max(0.5, 1.5 / ranks)
    repeated = []
    for rank, count in sorted(counts.items(), key=lambda kv: -kv[1]):
        share, lag = count / len(rows), mean(lags[rank])
        if share >= need_share and step_time_mean_s and lag >= threshold * step_time_mean_s:
            repeated.append({"rank": rank, "share": share, "lag_mean_s": lag})
    worst = sorted(rows, key=lambda row: -row[2])[:5]
    return {
        "steps_compared": len(rows), "spread_mean_s": spread,
        "slowest_counts": {str(r): c for r, c in sorted(counts.items())},
        "repeated": repeated,
        "worst_steps": [{"step": s, "rank": r, "lag_s": lag} for s, r, lag in worst],
    }
