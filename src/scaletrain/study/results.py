"""study.json entries from the points' run summaries: epoch times over repeats, speedup, ideal, efficiency."""

from __future__ import annotations

import json
import statistics
from typing import Any

from scaletrain.config import layout_of


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
        # how the point ran: what a speedup above the ideal is checked against (scaling_flags)
        "threads_per_rank": first.get("threads_per_rank", config.get("threads")),
        "cpu_cores": first.get("cpu_cores"), "device": first.get("device"),
    }
    failed = [(k, r) for k, r in enumerate(runs) if r["status"] == "failed"]
    if failed:
        k, run = failed[0]
        entry["error"] = (f"r{k}: " if len(runs) > 1 else "") + (run.get("error") or "failed")
    return entry


def _nproc(entry: dict[str, Any]) -> int:
    """The processes of a node that train: nproc, less the servers of a parameter-server point (the layout's)."""
    axes, config = entry.get("axes") or {}, entry.get("config") or {}
    nproc = axes.get("nproc", config.get("nproc") or 1)
    layout = layout_of({**config, **axes, "nnodes": 1, "master_port": None})
    return max(1, layout.trainers) if layout is not None else nproc


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


def above_ideal(efficiency: float | None) -> bool:
    """Efficiency above 1.0 as shown (two decimals): a speedup larger than the processes added."""
    return efficiency is not None and round(efficiency, 2) > 1.0


def threads_per_rank(entry: dict[str, Any]) -> int | None:
    """Torch intra-op threads each CPU rank of the point used: recorded by the run, else its --threads, else None."""
    recorded = entry.get("threads_per_rank")
    return recorded if recorded is not None else (entry.get("config") or {}).get("threads")


def on_gpu(entry: dict[str, Any]) -> bool:
    device = entry.get("device") or (entry.get("config") or {}).get("device") or ""
    return str(device).startswith("cuda")


def _where(entry: dict[str, Any], axes: list[str]) -> str:
    return ", ".join(f"{a}={entry['axes'][a]}" for a in axes if a in entry.get("axes", {})) or entry["id"]


def scaling_flags(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points whose efficiency is above 1.0, each with the likely causes and the fix (docs/study.md).

    More speedup than processes added is not a real speedup: the baseline point ran slower than it
    could (fewer threads per rank than the cores it had, a busy machine), or the points did not run
    the same threads per rank, so the nproc ratio is not what changed between them.
    """
    by_id = {e["id"]: e for e in entries}
    varying = [a for a in dict.fromkeys(k for e in entries for k in e.get("axes", {}))
               if a == "nproc" or len({repr(e.get("axes", {}).get(a)) for e in entries}) > 1]
    flags = []
    for e in entries:
        if not above_ideal(e.get("efficiency")):
            continue
        base = by_id.get(e.get("baseline")) or {}
        t, tb = threads_per_rank(e), threads_per_rank(base)
        series = [x for x in entries if x.get("baseline") == e.get("baseline")]
        causes = _causes(e, base, t, tb, _where(base, varying) if base else "the baseline")
        cores = e.get("cpu_cores") or base.get("cpu_cores")
        most = max(_nproc(x) for x in series) if series else _nproc(e)
        rerun = max(1, cores // most) if cores else 1
        fix = ("rerun the series on an otherwise idle machine" if on_gpu(e) else
               f"rerun with --threads {rerun} for every point")
        ratios = ", ".join(f"{name} {e[key]:.2f}x" for name, key in (("speedup", "speedup"), ("ideal", "ideal_speedup"))
                           if e.get(key) is not None)  # a hand-edited study.json may lack one
        message = (f"efficiency {e['efficiency']:.2f} above 1.0 at {_where(e, varying)}"
                   + (f" ({ratios})" if ratios else "") + f": not a real speedup — {', or '.join(causes)}; {fix}")
        flags.append({"id": e["id"], "baseline": e.get("baseline"), "efficiency": e["efficiency"],
                      "threads_per_rank": t, "baseline_threads_per_rank": tb, "cpu_cores": cores,
                      "causes": causes, "rerun_threads": None if on_gpu(e) else rerun, "message": message})
    return flags


def _causes(e: dict[str, Any], base: dict[str, Any], t: int | None, tb: int | None, base_name: str) -> list[str]:
    """Why a point's speedup may be above the ideal, most likely first; the busy machine is always possible."""
    causes = []
    if on_gpu(e):
        return [f"the baseline ({base_name}) was slowed by other work on the machine or GPU",
                "the points ran on different GPUs"]
    if t is not None and tb is not None and t != tb:
        causes.append(f"the baseline ({base_name}) ran {tb} thread{'s' * (tb != 1)}/rank vs {t} here")
    cores = base.get("cpu_cores")
    if tb is not None and cores and tb * _nproc(base) < cores:
        causes.append(f"the baseline used {tb * _nproc(base)} of the {cores} cores (starved)")
    if t is None or tb is None:
        which = "this point or its baseline" if t is None and tb is None else "this point" if t is None \
            else "the baseline"
        causes.append(f"the threads per rank of {which} are unknown (not recorded), so the baseline may have "
                      "run with fewer threads per rank than it had cores")
    return [*causes, "the machine was busy while the baseline ran"]


__all__ = ["run_epoch_time", "point_status", "point_entry", "add_speedups", "study_entries", "failed_points",
           "above_ideal", "threads_per_rank", "on_gpu", "scaling_flags"]
