"""What limits a run, in plain words, with the lever to pull and the number behind it (pure).

Findings (most severe first), shares being fractions of the mean step time:
  input-bound          data_wait share >= diag_input (default 0.15), or the wait for each epoch's
                       first batch (loader workers starting) >= diag_input of an epoch
  communication-bound  comm_exposed share >= diag_comm (default 0.15)
  straggler            a rank slowest in most steps by >= diag_straggler (default 0.10) of a step
  compute-bound        none of the above: forward + backward + optimizer dominate
"""

from __future__ import annotations

from typing import Any

DEFAULT_THRESHOLDS = {"diag_input": 0.15, "diag_comm": 0.15, "diag_straggler": 0.10}


def thresholds_from(config: dict[str, Any], override: dict[str, float] | None = None) -> dict[str, float]:
    return {k: float((override or {}).get(k, config.get(k, v))) for k, v in DEFAULT_THRESHOLDS.items()}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def diagnose(run: dict[str, Any], stragglers: dict[str, Any], config: dict[str, Any],
             thresholds: dict[str, float]) -> list[dict[str, Any]]:
    """Findings for a run's means (`phases_mean_s`, `step_time_mean_s`, `overlap_ratio`)."""
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
    # asynchronous workers (ps-async) never wait for each other: a slower one is no straggler
    repeated = [] if config.get("strategy") == "ps-async" else stragglers.get("repeated", [])
    for s in repeated:
        share = s["lag_mean_s"] / step
        findings.append({"kind": "straggler", "share": share, "rank": s["rank"],
                         "message": f"rank {s['rank']} was the slowest in {s['share']:.0%} of steps, by "
                                    f"{_ms(s['lag_mean_s'])} ({share:.0%} of a step) on average; the others wait for it",
                         "lever": f"look at what slows rank {s['rank']}: other load on its host or device, its "
                                  "data-loader workers, uneven data, thermal limits"})
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
    return sorted(findings, key=lambda f: -f["share"])
