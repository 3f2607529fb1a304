"""Analyses of recorded runs: pure functions from per-rank step records to tables of numbers.

`analyze_run` gives exactly the profiler's keys of summary.json (see docs/metrics.md).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from scaletrain.analysis.cpu import cpu_stats
from scaletrain.analysis.diagnosis import DEFAULT_THRESHOLDS, diagnose, thresholds_from
from scaletrain.analysis.steps import epoch_start_wait, run_means, steady, steady_span
from scaletrain.analysis.stragglers import slowest_by_step, straggler_stats
from scaletrain.analysis.throughput import settled_step
from scaletrain.rundir import RunDir, read_jsonl

Records = list[dict[str, Any]]


RANK_FILE = re.compile(r"metrics-rank(\d+)\.jsonl")
RUN_FACTS = ("device", "local_world_size", "threads_per_rank", "cpu_cores", "testbed", "gradient_bytes",
             "gradient_buckets", "compressible", "exchange_settings", "lockstep")
"""Facts of how a run sat and exchanged (summary.json) that the analysis reads with the config, as the trainer
passed them; re-analyses (report, watch) take them from summary.json."""


def load_records(run_dir: str | Path, world_size: int | None = None,
                 notes: list[str] | None = None) -> dict[int, Records]:
    """{rank: step records} from metrics-rank{r}.jsonl (all ranks present, or ranks 0..world_size-1).

    With `notes`, a cut-off last line is left out and noted rather than an error (see read_jsonl)."""
    run = RunDir(Path(run_dir))
    if world_size is None:
        ranks = sorted(int(m.group(1)) for f in run.root.iterdir() if (m := RANK_FILE.fullmatch(f.name)))
    else:
        ranks = list(range(world_size))
    # a rank's file may be out of reach (another node without a shared file system): left out, not 0
    return {rank: read_jsonl(run.metrics(rank), notes) for rank in ranks if run.metrics(rank).is_file()}


def analyze_run(records_by_rank: dict[int, Records], config: dict[str, Any],
                thresholds: dict[str, float] | None = None,
                memory: list[tuple[int, int, str]] | None = None) -> dict[str, Any]:
    """Phases, overlap, stragglers, memory, CPU use and diagnosis of a run from its records.

    Config keys read (all optional): the settings levers name (workers, persistent_workers, dataset, batch_size,
    bucket_cap_mb, compress, strategy, ps_servers, ps_push, nproc, nnodes, stages, microbatches, split,
    precision), the RUN_FACTS, and the diag_* thresholds; analysis/levers.py says which lever needs which."""
    limits = thresholds_from(config, thresholds)
    settled = settled_step(records_by_rank)
    steady_by_rank = {r: steady(recs, settled) for r, recs in records_by_rank.items()}
    means = run_means(steady_by_rank)
    stragglers = straggler_stats(steady_by_rank, means["step_time_mean_s"], limits["diag_straggler"])
    counts = stragglers["slowest_counts"]
    compared = stragglers["steps_compared"]
    for rank_stats in means["ranks"]:
        rank_stats["slowest_share"] = counts.get(str(rank_stats["rank"]), 0) / compared if compared else None
    result = {**means, "epoch_start": epoch_start_wait(records_by_rank), "stragglers": stragglers,
              "thresholds": limits, "steady": steady_span(records_by_rank, steady_by_rank, settled)}
    if memory:
        by_rank = {rank: (peak, kind) for rank, peak, kind in memory}
        for rank_stats in means["ranks"]:
            rank_stats["peak_memory_bytes"] = by_rank.get(rank_stats["rank"], (None, None))[0]
        result["peak_memory_bytes"] = max(peak for _, peak, _ in memory)
        result["memory_kind"] = memory[0][2]
    result["cpu"] = cpu_stats(steady_by_rank, config, memory[0][2] if memory else None)
    result["diagnosis"] = diagnose({**means, "epoch_start": result["epoch_start"], "cpu": result["cpu"]},
                                   stragglers, config, limits)
    return result


__all__ = ["load_records", "analyze_run", "RUN_FACTS", "steady", "slowest_by_step", "DEFAULT_THRESHOLDS"]
