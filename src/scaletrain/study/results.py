"""study.json entries from the points' run summaries: epoch times over repeats, speedup, ideal, efficiency."""

from __future__ import annotations

import json
import statistics
from typing import Any


def run_epoch_time(summary: dict[str, Any]) -> float | None:
    """A run's epoch time: the median of its epochs (robust to the first one, which includes loader start-up)."""
    times = summary.get("epoch_times_s") or []
    return statistics.median(times) if times else None


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def point_status(runs: list[dict[str, Any]]) -> str:
    """failed if any repeat failed, completed if all did, else pending."""
    statuses = [r["status"] for r in runs]
    if "failed" in statuses:
        return "failed"
    return "completed" if statuses and all(s == "completed" for s in statuses) else "pending"


def point_entry(point_id: str, axes: dict[str, Any], config: dict[str, Any],
                runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One study.json entry without its speedups; `runs` holds {dir, status, summary, error} per repeat."""
    # the numbers average over the completed runs (`repeats` counts them); phases, overlap and
    # diagnosis come from the first one, as they describe the point rather than the noise
    done = [r["summary"] for r in runs if r["status"] == "completed" and r.get("summary")]
    times = [t for t in (run_epoch_time(s) for s in done) if t is not None]
    first = done[0] if done else {}
    entry: dict[str, Any] = {
        "id": point_id, "axes": axes, "config": config, "runs": [r["dir"] for r in runs],
        "status": point_status(runs),
        "epoch_time_s": statistics.fmean(times) if times else None,
        # one run measures no noise: say so with null rather than a std of 0
        "epoch_time_std_s": statistics.stdev(times) if len(times) > 1 else None,
        "samples_per_s": _mean([s.get("samples_per_s") for s in done]),
        "speedup": None, "ideal_speedup": None, "efficiency": None, "baseline": None,
        "phases_mean_s": first.get("phases_mean_s"), "overlap_ratio": first.get("overlap_ratio"),
        "diagnosis": first.get("diagnosis"), "top1": _mean([s.get("top1") for s in done]),
        "repeats": len(done),
    }
    failed = [(k, r) for k, r in enumerate(runs) if r["status"] == "failed"]
    if failed:
        k, run = failed[0]
        entry["error"] = (f"r{k}: " if len(runs) > 1 else "") + (run.get("error") or "failed")
    return entry


def _nproc(entry: dict[str, Any]) -> int:
    """The processes that train: nproc, less the servers of a parameter-server point."""
    nproc = entry["axes"].get("nproc", entry["config"].get("nproc", 1))
    if str(entry["config"].get("strategy", "")).startswith("ps-"):
        return max(1, nproc - entry["axes"].get("ps_servers", entry["config"].get("ps_servers", 1)))
    return nproc


def add_speedups(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the entries with speedup, ideal_speedup, efficiency and baseline filled in (docs/study.md)."""
    # series = same axis values but nproc; baseline = its smallest nproc; speedup = baseline time / time;
    # ideal = nproc / baseline nproc; efficiency = speedup / ideal
    out = [dict(e) for e in entries]
    series: dict[str, list[dict[str, Any]]] = {}
    for e in out:
        key = json.dumps({k: v for k, v in e["axes"].items() if k != "nproc"}, sort_keys=True)
        series.setdefault(key, []).append(e)
    for members in series.values():
        base = min(members, key=_nproc)
        for e in members:
            e["baseline"] = base["id"]
            e["ideal_speedup"] = _nproc(e) / _nproc(base)
            if base["epoch_time_s"] and e["epoch_time_s"]:
                e["speedup"] = base["epoch_time_s"] / e["epoch_time_s"]
                e["efficiency"] = e["speedup"] / e["ideal_speedup"]
            else:  # a missing measurement is no speedup at all, not a speedup of 0
                e["speedup"] = e["efficiency"] = None
    return out


def study_entries(points: list[Any], runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The whole study.json list, in grid order; `points` have .id, .axes and .settings()."""
    return add_speedups([point_entry(p.id, p.axes, p.settings(), runs[p.id]) for p in points])


def failed_points(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e["status"] == "failed"]


__all__ = ["run_epoch_time", "point_status", "point_entry", "add_speedups", "study_entries", "failed_points"]
