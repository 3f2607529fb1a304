"""How far a plan's ranking holds when its top candidates are measured (plan --validate, docs/plan.md).

Pure: the ranked candidates and each one's measured runs (validate/match.MeasuredRun, one per round) in, the
re-ranking, each candidate's errors and the ranking's agreement out. Candidates are compared by their time to
train, the measured one being the predicted time scaled by measured over predicted step time (the epoch's steps
are the plan's). Rounds ran interleaved, every candidate once per round, so a candidate's time over the chosen
one's in the same round cancels the machine's drift: the re-ranking and the "within 5% of the best" use those
paired ratios, and each says how far its rounds spread."""

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
    rows = []
    for c in ranked:
        mine = runs.get(c["id"]) or []
        if not mine:
            rows.append({"id": c["id"], "predicted_rank": c["rank"], "measured_rank": None, "runs": 0})
            continue
        measured, _ = measured_of(mine)
        predicted = {"step_time_s": c["step_time_s"], "phases_s": c["phases_s"], "samples_per_s": c["samples_per_s"],
                     "peak_memory_bytes": c["peak_memory_bytes"], "memory_kind": c.get("memory_kind")}
        paired = [t / times[chosen["id"]][k] for k, t in times[c["id"]].items() if k in times[chosen["id"]]]
        own = c is chosen  # its ratio to itself is 1 in every round: no spread to speak of
        ratio = statistics.median(paired) if paired else None
        rows.append({"id": c["id"], "predicted_rank": c["rank"], "measured_rank": None, "runs": len(mine),
                     "predicted_time_to_train_s": c["time_to_train_s"],
                     "measured_time_to_train_s": statistics.median(times[c["id"]].values()),
                     "measured": measured, "errors": point_errors(measured, predicted),
                     "ratio_to_chosen": {"predicted": c["time_to_train_s"] / chosen["time_to_train_s"],
                                         "measured": ratio,
                                         "rounds": len(paired), "spread": None if own else _spread(paired),
                                         "error": relative(c["time_to_train_s"] / chosen["time_to_train_s"], ratio)}})
    return {**_ranking(rows), "candidates": rows, **_summaries(rows)}


def _spread(values: list[float]) -> float | None:
    """(max - min) / median of a ratio over its rounds (None with fewer than two)."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else None


def _ranking(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Re-rank by the paired ratio (without one, the chosen failed: by the measured time); where the chosen one
    stands against the measured best; Kendall's tau between the two orders."""
    timed = [r for r in rows if r["runs"]]
    if not timed:
        return {"measured_order": [], "best": None, "chosen_is_best": None, "chosen_behind_best": None,
                "best_by_beyond_spread": None, "kendall_tau": None, "top3_predicted_ranks": []}
    paired = all(r["ratio_to_chosen"]["measured"] is not None for r in timed)
    key = (lambda r: r["ratio_to_chosen"]["measured"]) if paired else (lambda r: r["measured_time_to_train_s"])
    order = sorted(timed, key=key)
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
                f"{100 * v['chosen_behind_best']:.1f}% behind it ({sure} its rounds' spread "
                f"{_pct(best['ratio_to_chosen']['spread'])})")
    else:
        head = f"measured fastest: #{best['predicted_rank']}; the chosen one did not run to the end"
    tau = f"; Kendall's tau {v['kendall_tau']:+.2f}" if v["kendall_tau"] is not None else ""
    order = ", ".join(f"#{k}" for k in v["top3_predicted_ranks"])
    return f"validation: {head}; measured top {len(v['top3_predicted_ranks'])} in predicted ranks {order}{tau}"


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.1f}%"
