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
"""

from __future__ import annotations

from typing import Any

DEFAULT_THRESHOLDS = {"diag_input": 0.15, "diag_comm": 0.15, "diag_straggler": 0.10,
                      "diag_cpu_util": 0.6, "diag_cpu_spread": 3.0}
SPREAD_MATTERS = 0.10  # a spread counts when p90 - p10 is at least this share of the mean step
WAITING = ("communication-bound", "pipeline-bound", "straggler")  # what a descheduled peer inflates


def thresholds_from(config: dict[str, Any], override: dict[str, float] | None = None) -> dict[str, float]:
    return {k: float((override or {}).get(k, config.get(k, v))) for k, v in DEFAULT_THRESHOLDS.items()}


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


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
        more = max(2, 2 * workers) if workers is not None else None
        with_workers = f" with {workers} loader worker{'s' if workers != 1 else ''} per rank" if workers is not None else ""
        lever = (f"try --workers {more}" if more is not None else "add data-loader workers") + \
            " (more parallel decoding), a smaller --image-size, or images stored pre-decoded"
        findings.append({"kind": "input-bound", "share": data,
                         "message": f"{data:.0%} of each step ({_ms(phases['data_wait'])} of {_ms(step)}) "
                                    f"waits for data{with_workers}",
                         "lever": lever})
    start = run.get("epoch_start")
    if start and start["wait_mean_s"] > 0:
        epoch = start["steps_per_epoch"] * step + start["wait_mean_s"]
        share = start["wait_mean_s"] / epoch
        if share >= thresholds["diag_input"]:
            who = (f"{workers} loader worker process{'es' if workers > 1 else ''} per rank starting" if workers
                   else "the first batch being loaded")
            lever = ("keep the workers alive between epochs: --persistent-workers" if workers
                     else "load the first batch sooner: fewer/smaller files per batch")
            findings.append({"kind": "input-bound", "share": share, "epoch_start": True,
                             "message": f"each epoch first waits {start['wait_mean_s']:.2f} s for data ({who}): "
                                        f"{share:.0%} of an epoch, not counted in the steady-state step",
                             "lever": lever})
    comm = phases["comm_exposed"] / step
    if comm >= thresholds["diag_comm"]:
        overlap = run.get("overlap_ratio")
        hidden = f"; {overlap:.0%} of the communication is hidden behind backward" if overlap is not None else ""
        batch = config.get("batch_size")
        bigger = f"--batch-size {2 * batch}" if batch else "a larger batch per rank"
        strategy = config.get("strategy") or ""
        if strategy.startswith("ps-"):  # the exchange follows backward whole; the servers' links are the limit
            servers = config.get("ps_servers") or 1
            lever = (f"spread the parameters over more servers: try --ps-servers {2 * servers}; or more compute "
                     f"per exchange: {bigger}" + ("; or push less often: --ps-push 4" if strategy == "ps-async" else ""))
        elif overlap is not None and overlap < 0.5 and config.get("bucket_cap_mb") == "auto":
            lever = ("--bucket-cap-mb auto already chose the size the model predicts hides the most: more compute "
                     f"per exchange: {bigger}; or fewer bytes: --precision bf16, gradient compression")
        elif overlap is not None and overlap < 0.5 and "bucket_cap_mb" in config:
            cap = config["bucket_cap_mb"] or 25.0  # unset: DDP's default of 25 MiB
            lever = (f"start reducing earlier with smaller buckets: try --bucket-cap-mb {cap / 4:g}; "
                     f"or more compute per exchange: {bigger}")
        else:
            lever = f"more compute per exchange: try {bigger}; or fewer bytes: --precision bf16, gradient compression"
        findings.append({"kind": "communication-bound", "share": comm,
                         "message": f"{comm:.0%} of each step ({_ms(phases['comm_exposed'])}) waits for gradient "
                                    f"communication after backward{hidden}",
                         "lever": lever})
    waits = pipeline_bound(phases, step, config, thresholds)
    if waits is not None:
        findings.append(waits)
    # asynchronous workers (ps-async) never wait for each other: a slower one is no straggler
    repeated = [] if config.get("strategy") == "ps-async" else stragglers.get("repeated", [])
    for s in repeated:
        share = s["lag_mean_s"] / step
        findings.append({"kind": "straggler", "share": share, "rank": s["rank"],
                         "message": f"rank {s['rank']} was the slowest in {s['share']:.0%} of steps, by "
                                    f"{_ms(s['lag_mean_s'])} ({share:.0%} of a step) on average; the others wait for it",
                         "lever": f"look at what slows rank {s['rank']}: other load on its host or device, its "
                                  "data-loader workers, uneven data, thermal limits"})
    cpu = oversubscribed(run.get("cpu"), phases, step, thresholds)
    if cpu is not None:
        findings.append(cpu)
    if not findings:
        compute_s = phases["forward"] + phases["backward"] + phases["optimizer"]
        share = compute_s / step
        exposed = f"exposed communication is only {comm:.0%} of a step"
        if config.get("precision", "fp32") == "fp32" and config.get("device") == "cuda":
            lever = f"faster arithmetic: --precision bf16 on hardware with bf16 units; or more devices ({exposed})"
        else:
            lever = f"more devices ({exposed}, so more ranks should scale), a larger --batch-size for " \
                    "better utilisation, or a smaller model"
        findings.append({"kind": "compute-bound", "share": share,
                         "message": f"{share:.0%} of each step ({_ms(compute_s)} of {_ms(step)}) is forward, "
                                    "backward and optimizer compute; data and communication are not the limit",
                         "lever": lever})
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
    more = (k - 1) / (2 * m + k - 1)
    measured = bubble / step
    if measured > 1.5 * theory and config.get("split") != "auto":
        lever = (f"the bubble is {measured / theory:.1f}x theory's: balance the stages with --split auto "
                 f"(`scaletrain split` shows each stage's time); or --microbatches {2 * m}")
    elif measured > 1.5 * theory:
        lever = (f"the bubble is {measured / theory:.1f}x theory's although the split is balanced as predicted: "
                 f"check the stage times in the report against `scaletrain split`; or --microbatches {2 * m}")
    else:
        lever = (f"--microbatches {2 * m} (theory's bubble falls from {theory:.0%} to {more:.0%}; the batch must "
                 f"divide), fewer stages, or a larger --batch-size")
    return {"kind": "pipeline-bound", "share": share,
            "message": f"{share:.0%} of each step waits in the pipeline: {_ms(bubble)} bubble ({measured:.0%}, "
                       f"theory (K-1)/(M+K-1) = {theory:.0%} for K={k}, M={m}) and {_ms(p2p)} send/receive",
            "lever": lever}


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
                   thresholds: dict[str, float]) -> dict[str, Any] | None:
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
        measured.append(", ".join(f"{phase} p90 is {s['ratio']:.1f}x its p10 ({_ms(s['p90_s'])} vs "
                                  f"{_ms(s['p10_s'])}, rank {s['rank']})" for phase, s in spreads))
    if not evidence:
        return None
    head = f"{_n(ranks, 'rank')} x {_n(threads, 'thread')} on {_n(cores, 'core')}" if "threads" in evidence else ""
    message = (head + ": " if head else "") + (", and ".join(measured) if measured else
                                               "more busy threads than cores, so they take turns")
    testbed = "on the testbed, fewer hosts or --cores-per-host"
    if "threads" in evidence and ranks > cores:
        lever = f"at most {cores} ranks per node on {_n(cores, 'core')}: --nproc {cores} --threads 1; {testbed}"
    elif "threads" in evidence:
        fit = cores // ranks
        lever = f"--threads {fit} so that ranks x threads <= cores ({ranks} x {fit} <= {cores}); {testbed}"
    else:
        now = f" (now {threads})" if threads else ""
        lever = ("give each process its own cores: on the testbed (hosts share this machine's cores) fewer hosts "
                 f"or --cores-per-host; elsewhere stop other jobs on these cores, or lower --threads{now} so "
                 "that all ranks' threads fit the free cores")
    compute = (phases["forward"] + phases["backward"] + phases["optimizer"]) / step
    return {"kind": "cpu-oversubscribed", "share": compute, "evidence": evidence,
            "message": message, "lever": lever}
