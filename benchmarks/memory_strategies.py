"""The memory model against each strategy's measured peak on this machine: how much a rank's peak grows from
one batch size to another, measured (the profiler's peak resident set size per rank, or the CUDA allocator's
peak on a GPU) against `predict`'s memory per rank at the same two points (the one memory model, which the
pre-flight check plans with). The difference cancels what neither batch changes (the interpreter, torch, the
dataset), so it isolates the activations; the peaks themselves are set side by side too (the fullest rank's).

    .venv/bin/python benchmarks/memory_strategies.py [--out DIR] [--batches 16,64] [--allocator lean]  # ~2 min here

--allocator (train's flag; default steady, as a run without --memory-per-device): under lean the resident peak is
the live one (distributed/allocator.py), which is what the model counts beside the heap glibc keeps.

Writes DIR/memory-strategies.json; docs/predict-validation.md keeps the dated results."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STRATEGIES = {"allreduce": [], "ring": [], "ps-sync": ["--ps-servers", "1"], "fsdp": [],
              "pipeline": ["--stages", "2", "--microbatches", "4"]}
RUN = {"model": "resnet20", "dataset": "synthetic", "image_size": 64, "nproc": 2, "epochs": 1, "threads": 1}


def train(out: Path, strategy: str, batch: int, allocator: str) -> dict:
    argv = [sys.executable, "-m", "scaletrain", "train", "--no-progress", "--out", str(out), "--strategy", strategy,
            "--batch-size", str(batch), "--synthetic-samples", str(8 * batch), *STRATEGIES[strategy],
            "--allocator", allocator]
    for k, v in RUN.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{strategy} at batch {batch} failed:\n{done.stderr[-2000:]}")
    s = json.loads((out / "summary.json").read_text())
    return {"memory_kind": s["memory_kind"], "ranks": {r["rank"]: r["peak_memory_bytes"] for r in s["ranks"]}}


def predicted(strategy: str, batch: int, allocator: str) -> int:
    """predict's memory per rank (the largest rank's), from a synthetic calibration: the memory model does not
    read the calibration's times, and the baseline cancels in the difference."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from predict_fixtures import NETWORK, fake_calibration
    from scaletrain.config import build_config
    from scaletrain.predict.points import predict_config
    from scaletrain.predict.predictor import Predictor

    extra = {"ps-sync": {"ps_servers": 1}, "pipeline": {"stages": 2, "microbatches": 4}}.get(strategy, {})
    cfg = build_config({}, {**RUN, "batch_size": batch, "strategy": strategy, "allocator": allocator, **extra})
    return sum(predict_config(Predictor(fake_calibration(), NETWORK), cfg)["memory_bytes"].values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--batches", default="16,64")
    p.add_argument("--allocator", choices=("steady", "lean"), default="steady")
    a = p.parse_args()
    small, large = (int(b) for b in a.batches.split(","))
    out = a.out or Path(tempfile.mkdtemp(prefix="memory-strategies-"))
    rows = []
    print(f"{'strategy':10s} {'predicted growth':>17s}  measured growth per rank (ratio measured / predicted)")
    for strategy in STRATEGIES:
        t = time.perf_counter()
        runs = [train(out / f"{strategy}-{b}", strategy, b, a.allocator) for b in (small, large)]
        planned = [predicted(strategy, b, a.allocator) for b in (small, large)]
        growth = (planned[1] - planned[0]) / 2**20
        measured = {r: (runs[1]["ranks"][r] - runs[0]["ranks"][r]) / 2**20 for r in runs[0]["ranks"]}
        rows.append({"strategy": strategy, "allocator": a.allocator, "batches": [small, large],
                     "predicted_growth_mib": growth,
                     "measured_growth_mib": measured, "memory_kind": runs[0]["memory_kind"],
                     "peaks_bytes": [r["ranks"] for r in runs], "predicted_bytes": planned})
        cells = ", ".join(f"rank {r} {v:.0f} MiB ({v / growth:.2f}x)" for r, v in measured.items())
        tops = [max(r["ranks"].values()) for r in runs]
        peaks = ", ".join(f"batch {b}: {m / 2**20:.0f} MiB predicted, {top / 2**20:.0f} measured ({m / top - 1:+.0%})"
                          for b, m, top in zip((small, large), planned, tops))
        print(f"{strategy:10s} {growth:13.0f} MiB  {cells}   [{time.perf_counter() - t:.0f} s]\n"
              f"{'':10s} peaks: {peaks}", flush=True)
    (out / "memory-strategies.json").write_text(json.dumps(rows, indent=1))
    print(f"memory-strategies.json: {out / 'memory-strategies.json'}")


if __name__ == "__main__":
    main()
