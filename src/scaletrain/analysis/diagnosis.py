"""What limits a run, in plain words, with the lever to pull and the number behind it (pure).

Findings (most severe first), shares being fractions of the mean step time:
  input-bound          data_wait share >= diag_input (default 0.15), or the wait for each epoch's
                       first batch (loader workers starting) >= diag_input of an epoch
  communication-bound  comm_exposed share >= diag_comm (default 0.15)
  pipeline-bound       (pipelines) bubble + p2p share >= diag_comm: stages waiting on their neighbours
  straggler            a rank slowest in most steps by >= diag_straggler (default 0.10) of a step
  cpu-oversubscribed   on CPU: ranks x threads > cores, or forward+backward kept < diag_cpu_util (0.6) of
                       their threads busy, or forward/backward p90 > diag_cpu_spread (3) x p10
  compute-bound        none of the above: forward + backward + optimizer dominate

While the cores are oversubscribed, exposed communication and straggling are mostly ranks waiting for a
descheduled peer: communication-bound and straggler findings then come after cpu-oversubscribed, and say so.
Each finding's lever names only what can move its number on this run (analysis/levers.py).
"""

from __future__ import annotations

from typing import Any

from scaletrain import fmt
from scaletrain.analysis import levers

DEFAULT_THRESHOLDS = {"diag_input": 0.15, "diag_comm": 0.15, "diag_straggler": 0.10,
                      "diag_cpu_util": 0.6, "diag_cpu_spread": 3.0}
SPREAD_MATTERS = 0.10  # a spread counts when p90 - p10 is at least this share of the mean step
WAITING = ("communication-bound", "pipeline-bound", "tiles-bound", "straggler")  # what a descheduled peer inflates


def thresholds_from(config: dict[str, Any], override: dict[str, float] | None = None) -> dict[str, float]:
    return {k: float((override or {}).get(k, config.get(k, v))) for k, v in DEFAULT_THRESHOLDS.items()}


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def diagnose(run: dict[str, Any], stragglers: dict[str, Any], config: dict[str, Any],
             thresholds: dict[str, float]) -> list[dict[str, Any]]:
    """Findings for a run's means (`phases_mean_s`, `step_time_mean_s`, `overlap_ratio`) and, on CPU,
    its CPU use (`cpu`, see analysis.cpu)."""
    phases, step = run.get("phases_mean_s"), run.get("step_time_mean_s")
    if not phases or not step:
        return []  # not profiled: nothing to say rather than a guess
    findings = []
    workers = config.get("workers", None)
    data = phases["data_wait"] / step
    if data >= thresholds["diag_input"]:
        with_workers = f" with {workers} loader worker{'s' if workers != 1 else ''} per rank" if workers is not None else ""
        findings.append({"kind": "input-bound", "share": data,
                         "message": f"{data:.0%} of each step ({fmt.ms(phases['data_wait'])} of {fmt.ms(step)}) "
                                    f"waits for data{with_workers}",
                         "lever": levers.input_lever(config)})
    start = run.get("epoch_start")
    if start and start["wait_mean_s"] > 0:
        epoch = start["steps_per_epoch"] * step + start["wait_mean_s"]
        share = start["wait_mean_s"] / epoch
        if share >= thresholds["diag_input"]:
            who = (f"{workers} loader worker process{'es' if workers > 1 else ''} per rank starting" if workers
                   else "the first batch being loaded")
            findings.append({"kind": "input-bound", "share": share, "epoch_start": True,
                             "message": f"each epoch first waits {start['wait_mean_s']:.2f} s for data ({who}): "
                                        f"{share:.0%} of an epoch, not counted in the steady-state step",
                             "lever": levers.epoch_start_lever(config)})
    comm = phases["comm_exposed"] / step
    if comm >= thresholds["diag_comm"]:
        overlap = run.get("overlap_ratio")
        hidden = f"; {overlap:.0%} of the communication is hidden behind backward" if overlap is not None else ""
        findings.append({"kind": "communication-bound", "share": comm,
                         "message": f"{comm:.0%} of each step ({fmt.ms(phases['comm_exposed'])}) waits for gradient "
                                    f"communication after backward{hidden}",
                         "lever": levers.comm_lever(config, overlap)})
    for bound in (pipeline_bound, tiles_bound):
        waits = bound(phases, step, config, thresholds)
        if waits is not None:
            findings.append(waits)
    # ranks that do not step together (ps-async's workers) never wait for each other: a slower one is no straggler
    repeated = [] if config.get("lockstep") is False else stragglers.get("repeated", [])
    for s in repeated:
        share = s["lag_mean_s"] / step
        findings.append({"kind": "straggler", "share": share, "rank": s["rank"],
                         "message": f"rank {s['rank']} was the slowest in {s['share']:.0%} of steps, by "
                                    f"{fmt.ms(s['lag_mean_s'])} ({share:.0%} of a step) on average; the others wait for it",
                         "lever": levers.straggler_lever(s["rank"], config)})
    cpu = oversubscribed(run.get("cpu"), phases, step, thresholds, config)
    if cpu is not None:
        findings.append(cpu)
    if not findings:
        compute_s = phases["forward"] + phases["backward"] + phases["optimizer"]
        share = compute_s / step
        findings.append({"kind": "compute-bound", "share": share,
                         "message": f"{share:.0%} of each step ({fmt.ms(compute_s)} of {fmt.ms(step)}) is forward, "
                                    "backward and optimizer compute; data and communication are not the limit",
                         "lever": levers.compute_lever(config, comm)})
    return _ordered(findings)


def pipeline_bound(phases: dict[str, float], step: float, config: dict[str, Any],
                   thresholds: dict[str, float]) -> dict[str, Any] | None:
    """A pipeline's stages waiting on their neighbours (bubble) and on transfers (p2p), or None; the lever
    depends on whether the bubble is theory's (K-1)/(M+K-1) or more (unequal stages)."""
    if "bubble" not in phases:
        return None
    bubble, p2p = phases["bubble"], phases.get("p2p", 0.0)
    share = (bubble + p2p) / step
    if share < thresholds["diag_comm"]:
        return None
    k = int(config.get("stages") or (config.get("nproc") or 2) * (config.get("nnodes") or 1))
    m = int(config.get("microbatches") or 1)
    theory = (k - 1) / (m + k - 1)
    measured = bubble / step
    return {"kind": "pipeline-bound", "share": share,
            "message": f"{share:.0%} of each step waits in the pipeline: {fmt.ms(bubble)} bubble ({measured:.0%}, "
                       f"theory (K-1)/(M+K-1) = {theory:.0%} for K={k}, M={m}) and {fmt.ms(p2p)} send/receive",
            "lever": levers.pipeline_lever(config, k, m, theory, measured)}


def tiles_bound(phases: dict[str, float], step: float, config: dict[str, Any],
                thresholds: dict[str, float]) -> dict[str, Any] | None:
    """Spatial tiles exchanging their halos (forward and backward) and gathering the front's output, or None."""
    if "halo" not in phases:
        return None
    halo, gather = phases["halo"], phases.get("gather", 0.0)
    share = (halo + gather) / step
    if share < thresholds["diag_comm"]:
        return None
    return {"kind": "tiles-bound", "share": share,
            "message": f"{share:.0%} of each step exchanges the tiles' borders: {fmt.ms(halo)} halo exchange "
                       f"(forward and backward) and {fmt.ms(gather)} gathering the tiles",
            "lever": levers.tiles_lever(config)}


def _ordered(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Largest share first; with cpu-oversubscribed, what it inflates comes after it, flagged."""
    cpu = next((f for f in findings if f["kind"] == "cpu-oversubscribed"), None)
    if cpu is None:
        return sorted(findings, key=lambda f: -f["share"])
    for f in findings:
        if f["kind"] in WAITING:
            f["message"] += "; likely inflated by the CPU oversubscription (ranks wait for a descheduled peer)"
            f["inflated_by"] = "cpu-oversubscribed"

    def key(f: dict[str, Any]) -> tuple[float, bool]:
        waiting = f["kind"] in WAITING
        return -(min(f["share"], cpu["share"]) if waiting else f["share"]), waiting

    return sorted(findings, key=key)


def oversubscribed(cpu: dict[str, Any] | None, phases: dict[str, float], step: float,
                   thresholds: dict[str, float], config: dict[str, Any]) -> dict[str, Any] | None:
    """The cpu-oversubscribed finding, or None (also when the run is not on CPU: `cpu` is None)."""
    if not cpu:
        return None
    threads, ranks, cores = cpu.get("threads_per_rank"), cpu.get("local_world_size"), cpu.get("cpu_cores")
    evidence, measured = [], []
    if threads and ranks and cores and ranks * threads > cores:
        evidence.append("threads")
    used = (cpu.get("utilisation") or {}).get("forward+backward")
    if used is not None and used < thresholds["diag_cpu_util"]:
        evidence.append("cpu_time")
        whose = f"their {threads} threads'" if threads and threads > 1 else "their thread's"
        measured.append(f"forward+backward used {used:.0%} of {whose} CPU time")
    spreads = [(phase, s) for phase, s in (cpu.get("spread") or {}).items() if s
               and s["ratio"] > thresholds["diag_cpu_spread"] and s["p90_s"] - s["p10_s"] >= SPREAD_MATTERS * step]
    if spreads:
        evidence.append("spread")
        measured.append(", ".join(f"{phase} p90 is {s['ratio']:.1f}x its p10 ({fmt.ms(s['p90_s'])} vs "
                                  f"{fmt.ms(s['p10_s'])}, rank {s['rank']})" for phase, s in spreads))
    if not evidence:
        return None
    head = f"{_n(ranks, 'rank')} x {_n(threads, 'thread')} on {_n(cores, 'core')}" if "threads" in evidence else ""
    message = (head + ": " if head else "") + (", and ".join(measured) if measured else
                                               "more busy threads than cores, so they take turns")
    compute = (phases["forward"] + phases["backward"] + phases["optimizer"]) / step
    return {"kind": "cpu-oversubscribed", "share": compute, "evidence": evidence,
            "message": message, "lever": levers.cpu_lever(evidence, threads, ranks, cores, config)}
