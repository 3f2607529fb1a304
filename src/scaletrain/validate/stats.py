"""The few statistics validation reports: quantiles, a point's spread over its repeats, the errors' signs."""

from __future__ import annotations

import statistics
from typing import Any

BIAS_MIN = 4  # errors of one sign needed before a shared sign is called a bias


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default): q=0.5 is the median."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def spread(step_times: list[float]) -> float | None:
    """How far a point's repeats differ: (max - min) / mean of their step times (None with one repeat)."""
    if len(step_times) < 2:
        return None
    mean = statistics.fmean(step_times)
    return (max(step_times) - min(step_times)) / mean if mean > 0 else None


def signs(errors: list[float]) -> dict[str, Any]:
    """Over and under counts; `biased` when every error (at least BIAS_MIN of them) has one sign: a model
    whose errors share a sign is off in one direction, whatever its median."""
    over = sum(1 for e in errors if e > 0)
    under = sum(1 for e in errors if e < 0)
    return {"over": over, "under": under, "biased": len(errors) >= BIAS_MIN and (over == 0 or under == 0)}
