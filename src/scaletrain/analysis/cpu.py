"""How busy the CPU threads were in the compute phases, and how steady those phases were (pure functions).

On CPU, a phase run by T intra-op threads that each had a core to itself takes CPU time of about T x its
wall time. When the cores are oversubscribed (ranks x threads > cores, testbed hosts sharing one
machine, other jobs), threads wait for a core: the phase's CPU time falls below T x wall, and the same
phase is fast in one step and several times slower in the next. Definitions: docs/metrics.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Records = list[dict[str, Any]]

JUDGED = ("forward", "backward")  # the compute phases whose CPU use and spread are judged
MEASURED = ("forward", "backward", "optimizer")
MIN_STEPS = 10  # steady steps a rank needs for a p90/p10 spread


def run_device(config: dict[str, Any], memory_kind: str | None = None) -> str | None:
    """`cpu`, `cuda` (or another device type) from the config, else from the kind of peak memory
    measured; None when neither says."""
    device = config.get("device")
    if device and device != "auto":
        return str(device)
    return {"cuda": "cuda", "rss": "cpu"}.get(memory_kind or "")


def threads_of(record: dict[str, Any], config: dict[str, Any]) -> int | None:
    """Intra-op threads of the rank that wrote `record`: the config's `threads_per_rank`, else the
    record's `threads` (torch.get_num_threads() as the profiler read it)."""
    threads = config.get("threads_per_rank") or record.get("threads")
    return int(threads) if threads else None


def utilisation(steady_by_rank: dict[int, Records], config: dict[str, Any]) -> dict[str, float] | None:
    """Per compute phase (and `forward+backward`): sum of CPU time / sum of (wall x threads) over all
    ranks' steady steps. None when no step recorded CPU time and threads."""
    cpu = dict.fromkeys(MEASURED, 0.0)
    capacity = dict.fromkeys(MEASURED, 0.0)
    for records in steady_by_rank.values():
        for r in records:
            threads = threads_of(r, config)
            if "phases_cpu_s" not in r or not threads:
                continue
            for phase in MEASURED:
                cpu[phase] += r["phases_cpu_s"][phase]
                capacity[phase] += r["phases_s"][phase] * threads
    if not any(capacity.values()):
        return None
    result = {p: cpu[p] / capacity[p] if capacity[p] > 0 else None for p in MEASURED}
    both = sum(capacity[p] for p in JUDGED)
    result["forward+backward"] = sum(cpu[p] for p in JUDGED) / both if both > 0 else None
    return result


def spread(values: list[float]) -> tuple[float, float] | None:
    """(p10, p90) of at least MIN_STEPS values with p10 > 0, else None."""
    if len(values) < MIN_STEPS:
        return None
    p10, p90 = (float(x) for x in np.percentile(np.asarray(values, dtype=float), [10, 90]))
    return (p10, p90) if p10 > 0 else None


def phase_spread(steady_by_rank: dict[int, Records]) -> dict[str, dict[str, Any] | None]:
    """Per judged phase, the rank whose wall time varies most from step to step:
    `{ratio: p90 / p10, rank, p10_s, p90_s}`; None when no rank has MIN_STEPS steady steps."""
    result: dict[str, dict[str, Any] | None] = {}
    for phase in JUDGED:
        worst = None
        for rank, records in sorted(steady_by_rank.items()):
            if not records or "phases_s" not in records[0]:
                continue
            p = spread([r["phases_s"][phase] for r in records])
            if p is not None and (worst is None or p[1] / p[0] > worst["ratio"]):
                worst = {"ratio": p[1] / p[0], "rank": rank, "p10_s": p[0], "p90_s": p[1]}
        result[phase] = worst
    return result


def cpu_stats(steady_by_rank: dict[int, Records], config: dict[str, Any],
              memory_kind: str | None = None) -> dict[str, Any] | None:
    """CPU use and steadiness of the compute phases of a run on CPU (summary.json's `cpu`).

    None on any other device, or when the device is not known: CPU time on a GPU run is the host's, not
    the device's work. Config keys read (all optional): device, threads_per_rank, local_world_size,
    cpu_cores."""
    if run_device(config, memory_kind) != "cpu":
        return None
    steps = [r for records in steady_by_rank.values() for r in records if "phases_s" in r]
    if not steps:
        return None
    timed = [r["cpu_time_s"] for r in steps if "cpu_time_s" in r]
    threads = config.get("threads_per_rank") or next((r["threads"] for r in steps if r.get("threads")), None)
    return {
        "threads_per_rank": threads,
        "local_world_size": config.get("local_world_size"),
        "cpu_cores": config.get("cpu_cores"),
        "cpu_time_mean_s": sum(timed) / len(timed) if timed else None,
        "utilisation": utilisation(steady_by_rank, config),
        "spread": phase_spread(steady_by_rank),
    }
