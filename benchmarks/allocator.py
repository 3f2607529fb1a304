"""What glibc malloc's thresholds (distributed/allocator.py) do to a training run: samples/s and each rank's peak
resident memory under scaletrain's two policies, `steady` (every run's default: freed tensors under 32 MiB
kept) and `lean` (`--allocator lean`, what a run with --memory-per-device uses: 1 MiB and more given back),
against glibc's own dynamic thresholds (`SCALETRAIN_MALLOC=default`), side by side in one run.

Three workloads, all `scaletrain train` on synthetic images with one torch thread per rank (2 ranks on 2 cores):
`ddp`, ResNet-20 data-parallel at 32 px (the overhead benchmark's run); `pipeline`, VGG-11 in 2 stages with 4
micro-batches at 32 px (the model whose 9.4 MB weight gradients made the threshold matter); `tiles`, ResNet-18
on 2 tiles of a 1,920 px image with block checkpointing (batch 1: large images, where memory is the point).
Runs interleave in a rotating order so that the drift of a shared machine hits every side alike. Reported per
workload and side: median samples/s (scaletrain's steady-state definition) with its min-max, the ratio of
medians to steady's with the per-repeat paired ratios' range, and the largest rank's peak RSS. A measurement,
not a test: exits 0 whatever the ratios (1 if a run fails).

    .venv/bin/python benchmarks/allocator.py                  # `make bench`, ~15 min
    .venv/bin/python benchmarks/allocator.py --repeats 1 --workloads ddp    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from scaletrain.distributed import allocator

WORKLOADS = {
    "ddp": ["--model", "resnet20", "--strategy", "allreduce", "--batch-size", "32", "--synthetic-samples", "2048",
            "--epochs", "2"],
    "pipeline": ["--model", "vgg11", "--strategy", "pipeline", "--stages", "2", "--microbatches", "4",
                 "--split", "uniform", "--batch-size", "32", "--synthetic-samples", "1024", "--epochs", "2"],
    "tiles": ["--model", "resnet18", "--strategy", "spatial", "--spatial", "2", "--checkpoint-activations", "blocks",
              "--batch-size", "1", "--synthetic-samples", "5", "--epochs", "1", "--image-size", "1920"],
}
COMMON = ["--dataset", "synthetic", "--image-size", "32", "--nproc", "2", "--threads", "1", "--optimizer", "sgd",
          "--no-augment", "--no-progress", "--tensorboard", "off", "--eval-every", "2"]
SIDES = {"steady": ["--allocator", "steady"], "lean": ["--allocator", "lean"], "default": ["--allocator", "steady"]}
SIDE_ENV = {"default": {allocator.OPT_OUT: "default"}}

console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs of each side, interleaved (default: %(default)s)")
    ap.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--json", metavar="PATH", help="write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    return args


def run(workload: str, side: str, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != allocator.OPT_OUT and k not in allocator.USER_VARIABLES
           and k != "GLIBC_TUNABLES"}
    # (a later --image-size wins over COMMON's)
    cmd = [sys.executable, "-m", "scaletrain", "train", *COMMON, *WORKLOADS[workload], *SIDES[side], "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**env, **SIDE_ENV.get(side, {})})
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        console.print(f"[red]{workload}/{side} failed (exit {proc.returncode}):[/red] {' '.join(cmd)}\n{tail}")
        sys.exit(1)
    s = json.loads((out / "summary.json").read_text())
    peaks = [r["peak_memory_bytes"] for r in s.get("ranks") or [] if r.get("peak_memory_bytes")]
    return {"samples_per_s": s["samples_per_s"], "malloc": s.get("malloc"), "peak_rss_bytes": max(peaks, default=None)}


def measure(workloads: list[str], repeats: int, tmp: Path) -> dict[str, dict[str, list[dict]]]:
    results = {w: {side: [] for side in SIDES} for w in workloads}
    sides = list(SIDES)
    for r in range(repeats):
        order = sides[r % len(sides):] + sides[:r % len(sides)]  # each side first in turn
        for w in workloads:
            for side in order:
                got = run(w, side, tmp / f"{w}-{side}-{r}")
                results[w][side].append(got)
                console.print(f"  repeat {r + 1}/{repeats} {w:>8} {side:>7}: {got['samples_per_s']:7.1f} samples/s, "
                              f"peak RSS {got['peak_rss_bytes'] / 2**20:.0f} MiB ({got['malloc']})")
    return results


def summarise(runs: dict[str, list[dict]]) -> dict:
    rate = {side: [r["samples_per_s"] for r in rs] for side, rs in runs.items()}
    out = {"median": {side: statistics.median(v) for side, v in rate.items()},
           "range": {side: (min(v), max(v)) for side, v in rate.items()},
           "ratio": {}, "paired": {},
           "peak_rss_mib": {side: max(r["peak_rss_bytes"] for r in rs) / 2**20 for side, rs in runs.items()}}
    for side, v in rate.items():  # against steady, each repeat with its own steady run
        paired = [x / s for x, s in zip(v, rate["steady"])]
        out["ratio"][side] = statistics.median(v) / statistics.median(rate["steady"])
        out["paired"][side] = (min(paired), max(paired))
    return out


def render(summary: dict[str, dict], repeats: int) -> None:
    table = Table(title=f"glibc malloc: scaletrain's steady and lean policies and glibc's own thresholds "
                        f"(default), {repeats} interleaved repeats each")
    for col in ("workload", "side", "samples/s", "min-max", "/ steady", "paired", "peak RSS MiB"):
        table.add_column(col, justify="right")
    for w, s in summary.items():
        for side in SIDES:
            lo, hi = s["range"][side]
            p_lo, p_hi = s["paired"][side]
            fmt = ".1f" if s["median"][side] >= 10 else ".3f"
            table.add_row(w, side, f"{s['median'][side]:{fmt}}", f"{lo:{fmt}}-{hi:{fmt}}", f"{s['ratio'][side]:.3f}",
                          f"{p_lo:.3f}-{p_hi:.3f}", f"{s['peak_rss_mib'][side]:.0f}")
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if allocator._glibc() is None:
        console.print("not glibc: scaletrain leaves the allocator alone here, nothing to compare")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-allocator-") as tmp:
        results = measure(args.workloads, args.repeats, Path(tmp))
    summary = {w: summarise(runs) for w, runs in results.items()}
    render(summary, args.repeats)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
