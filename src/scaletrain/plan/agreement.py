"""How far a plan's ranking holds when its top candidates are measured (plan --validate, docs/plan.md).

Pure: the ranked candidates and each one's measured runs (validate/match.MeasuredRun, one per round) in, the
re-ranking, each candidate's errors and the ranking's agreement out. Candidates are compared by their time to
train, the measured one being the predicted time scaled by measured over predicted step time (the epoch's steps
are the plan's). Rounds ran interleaved, every candidate once per round: each round's drift (round_drift, the
median over its candidates) is taken out of its runs, the re-ranking and "within 5% of the best" use the
drift-free times, and each candidate says how far those still spread over its rounds (their median absolute
deviation over their median), the ratio of two as far as their two spreads together."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from scaletrain.validate.match import MeasuredRun, error_summary, measured_of, point_errors, relative
from scaletrain.validate.stats import quantile, signs

CLOSE = 0.05  # the bar: the chosen configuration within 5% of the measured best


def _round(run: MeasuredRun) -> str:
    return Path(run.run_dir).name  # r0, r1, ...: the round the run was made in


def compare(ranked: list[dict[str, Any]], runs: dict[str, list[MeasuredRun]]) -> dict[str, Any]:
    """plan.json's `validation`: `ranked` the measured candidates in predicted order (the first the chosen one),
    `runs` each one's completed runs by id (a candidate with none failed and is left out of the re-ranking)."""
    chosen = ranked[0]
    times = {c["id"]: {_round(r): c["time_to_train_s"] * r.step_time_s / c["step_time_s"]
                       for r in runs.get(c["id"], [])} for c in ranked}
    drift = round_drift(times)
    steady = {cid: [t / drift[k] for k, t in ts.items()] for cid, ts in times.items() if ts}
    level = {cid: statistics.median(v) for cid, v in steady.items()}  # the time at the rounds' usual speed
    noise = {cid: _noise(v) for cid, v in steady.items()}
    base = level.get(chosen["id"])
    rows = []
    for c in ranked:
        mine = runs.get(c["id"]) or []
        if not mine:
            rows.append({"id": c["id"], "predicted_rank": c["rank"], "measured_rank": None, "runs": 0})
            continue
        measured, _ = measured_of(mine)
        measured["spread_without_drift"] = noise[c["id"]]
        predicted = {"step_time_s": c["step_time_s"], "phases_s": c["phases_s"], "samples_per_s": c["samples_per_s"],
                     "peak_memory_bytes": c["peak_memory_bytes"], "memory_kind": c.get("memory_kind")}
        ratio = level[c["id"]] / base if base else None
        spread = None
        if c is not chosen and base and noise[c["id"]] is not None and noise[chosen["id"]] is not None:
            spread = noise[c["id"]] + noise[chosen["id"]]  # how far the ratio of the two medians may be off
        predicted_ratio = c["time_to_train_s"] / chosen["time_to_train_s"]
        rows.append({"id": c["id"], "predicted_rank": c["rank"], "measured_rank": None, "runs": len(mine),
                     "predicted_time_to_train_s": c["time_to_train_s"],
                     "measured_time_to_train_s": statistics.median(times[c["id"]].values()),
                     "drift_free_time_to_train_s": level[c["id"]],
                     "measured": measured, "errors": point_errors(measured, predicted),
                     "ratio_to_chosen": {"predicted": predicted_ratio, "measured": ratio, "rounds": len(mine),
                                         "spread": spread, "error": relative(predicted_ratio, ratio)}})
    return {**_ranking(rows), "candidates": rows, "round_drift": drift, **_summaries(rows)}


def round_drift(times: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each round's speed against the usual: over the candidates that ran in it, the median of their time in that
    round over their median time over the rounds (1.2: the round ran 20% slow). A median over every candidate of
    the round: one run disturbed on its own moves its candidate, not the round."""
    typical = {cid: statistics.median(ts.values()) for cid, ts in times.items() if ts}
    rounds = sorted({k for ts in times.values() for k in ts})
    return {k: statistics.median([ts[k] / typical[cid] for cid, ts in times.items() if k in ts]) for k in rounds}


def _noise(values: list[float]) -> float | None:
    """A candidate's drift-free times' median absolute deviation over their median (None with fewer than two
    rounds): how far its usual round sits from the median it is ranked by. One disturbed run of three moves it
    as little as it moves the median."""
    if len(values) < 2:
        return None
    middle = statistics.median(values)
    return statistics.median(abs(v - middle) for v in values) / middle


def _ranking(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Re-rank by the drift-free time (its ratio to the chosen one's); where the chosen one stands against the
    measured best, and whether that lead exceeds the two candidates' spreads; Kendall's tau between the orders."""
    timed = [r for r in rows if r["runs"]]
    if not timed:
        return {"measured_order": [], "best": None, "chosen_is_best": None, "chosen_behind_best": None,
                "best_by_beyond_spread": None, "kendall_tau": None, "top3_predicted_ranks": []}
    paired = all(r["ratio_to_chosen"]["measured"] is not None for r in timed)
    order = sorted(timed, key=lambda r: r["drift_free_time_to_train_s"])
    for i, r in enumerate(order, 1):
        r["measured_rank"] = i
    best, chosen = order[0], rows[0]
    behind = None
    beyond = None
    if paired and chosen["runs"]:
        behind = 1 / best["ratio_to_chosen"]["measured"] - 1
        spread = best["ratio_to_chosen"]["spread"]
        beyond = None if spread is None or best is chosen else behind > spread
    tau = None
    if len(timed) > 1:
        from scipy.stats import kendalltau

        tau = float(kendalltau([r["predicted_rank"] for r in timed], [r["measured_rank"] for r in timed]).statistic)
    return {"measured_order": [r["id"] for r in order], "best": best["id"],
            "chosen_is_best": best is chosen, "chosen_behind_best": behind, "best_by_beyond_spread": beyond,
            "kendall_tau": tau, "top3_predicted_ranks": [r["predicted_rank"] for r in order[:3]]}


def _summaries(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Step time's errors over the candidates (with their repeats' spread), and the ratios to the chosen one's."""
    timed = [r for r in rows if r["runs"] and r["errors"]["step_time"] is not None]
    ratios = [r["ratio_to_chosen"]["error"] for r in rows[1:]
              if r["runs"] and r["ratio_to_chosen"]["error"] is not None]
    absolute = [abs(e) for e in ratios]
    return {"summary": error_summary([r["errors"]["step_time"] for r in timed],
                                     [r["measured"]["spread"] for r in timed]),
            "ratio_summary": {"count": len(ratios),
                              "median_abs_error": quantile(absolute, 0.5) if ratios else None,
                              "p90_abs_error": quantile(absolute, 0.9) if ratios else None, **signs(ratios)}}


def agreement_line(v: dict[str, Any], describe) -> str:
    """One line: the measured best against the chosen, and the order's agreement."""
    if v["best"] is None:
        return "validation: no candidate ran to the end (see their logs)"
    rows = {r["id"]: r for r in v["candidates"]}
    best = rows[v["best"]]
    if v["chosen_is_best"]:
        head = "the chosen configuration measured fastest"
    elif v["chosen_behind_best"] is not None:
        sure = {True: "beyond", False: "within", None: "against"}[v["best_by_beyond_spread"]]
        head = (f"measured fastest: #{best['predicted_rank']} ({describe(best['id'])}), the chosen one "
                f"{100 * v['chosen_behind_best']:.1f}% behind it ({sure} the two's spread over rounds "
                f"{_pct(best['ratio_to_chosen']['spread'])})")
    else:
        head = f"measured fastest: #{best['predicted_rank']}; the chosen one did not run to the end"
    tau = f"; Kendall's tau {v['kendall_tau']:+.2f}" if v["kendall_tau"] is not None else ""
    order = ", ".join(f"#{k}" for k in v["top3_predicted_ranks"])
    return f"validation: {head}; measured top {len(v['top3_predicted_ranks'])} in predicted ranks {order}{tau}"


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.1f}%"
