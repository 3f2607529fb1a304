"""How sure a plan is of its choice: the candidates priced so close to the chosen one that the model's own error
could reorder them (docs/plan.md, "How sure"). Pure: ranked candidates in, counts out."""

from __future__ import annotations

from typing import Any

BAND = {"calibration": 0.15, "datasheet": 0.25}
"""Relative time to train within which a candidate is one the model cannot tell from the chosen one. On a
calibration of the machine: the p90 of the model's ratio errors on held-out grids of this machine (2026-11-29,
calibration cal-s25b: 11.0%, 11.7% and 18.6% on three grids of two CNNs, docs/predict-validation.md), rounded up.
On a data sheet: the issue's bar for throughput against published figures (25%)."""


def uncertain(ranked: list[dict[str, Any]], basis: str) -> dict[str, Any]:
    """{band, count}: how many of the ranked candidates (the chosen one first, among them) are priced within the
    basis's BAND of the chosen one's time to train (count 0 with none ranked)."""
    band = BAND.get(basis, BAND["datasheet"])
    if not ranked:
        return {"band": band, "count": 0}
    limit = ranked[0]["time_to_train_s"] * (1 + band)
    return {"band": band, "count": sum(1 for c in ranked if c["time_to_train_s"] <= limit)}


def caveat(u: dict[str, Any], basis: str) -> str | None:
    """The line a plan prints when the model cannot tell its top candidates apart; None when it can."""
    n = u["count"]
    if n < 2:
        return None
    how = ("`--validate auto` (or `--validate %d`) measures them here, interleaved, and runs the fastest" % n
           if basis == "calibration" else
           "`scaletrain slurm validate-plan DIR --top auto` (all %d; `--top K` the first K) measures them on the "
           "cluster, and `train --plan DIR` then runs the fastest" % n)
    return (f"the top {n} candidates are priced within {100 * u['band']:.0f}% of the chosen one, the model's own "
            f"error on this basis (docs/plan.md, \"How sure\"): which of them is fastest is not certain; {how}")
