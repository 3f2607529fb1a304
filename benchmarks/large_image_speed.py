"""Samples/s of the large-image layouts at one side all of them train under 2 GiB per rank: ResNet-18 on synthetic
images, 2 ranks, batch 1 per replica (the pipeline: 2 micro-batches of 1), the layouts interleaved, repeated.

    .venv/bin/python benchmarks/large_image_speed.py [--side 1216] [--repeats 3] [--out DIR]   # about 8 min

Each run is `scaletrain train` for a few steps; its steady samples/s (summary.json) per repeat. Printed: per
layout the median and spread over repeats, and its ratio to spatial 2 within each repeat (median, min-max):
ratios of runs made minutes apart on a machine whose speed drifts. Writes DIR/large-image-speed.json."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LAYOUTS = {
    "spatial 2": ["--strategy", "spatial", "--spatial", "2"],
    "pipeline 2": ["--strategy", "pipeline", "--batch-size", "2", "--microbatches", "2"],
    "DDP + checkpointing": ["--checkpoint-activations", "blocks"],
    "DDP": [],
}
RUN = ["--model", "resnet18", "--dataset", "synthetic", "--synthetic-samples", "8", "--batch-size", "1",
       "--epochs", "1", "--nproc", "2", "--threads", "1", "--tensorboard", "off", "--no-progress"]


def rate(out: Path, layout: str, side: int) -> float | None:
    argv = [sys.executable, "-m", "scaletrain", "train", *RUN, *LAYOUTS[layout], "--image-size", str(side),
            "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        print(f"  {layout}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}", flush=True)
        return None
    summary = json.loads((out / "summary.json").read_text())
    # samples per second of the whole job: a pipeline's replica trains 2 images per step, the others 1 per replica
    return summary.get("samples_per_s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--side", type=int, default=1216)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="large-image-speed-"))
    rates: dict[str, list[float | None]] = {name: [] for name in LAYOUTS}
    for r in range(a.repeats):
        for name in LAYOUTS:
            value = rate(out / f"{name.replace(' ', '_')}-{r}", name, a.side)
            rates[name].append(value)
            print(f"  repeat {r + 1}: {name}: {value if value is None else f'{value:.3f}'} samples/s", flush=True)
    base = rates["spatial 2"]
    print(f"\nsamples/s at {a.side} x {a.side} (ResNet-18, 2 ranks, {a.repeats} repeats, interleaved)")
    print(f"{'layout':24s}{'median':>9s}{'min-max':>16s}{'/ spatial 2':>13s}{'min-max':>14s}")
    for name, values in rates.items():
        ok = [v for v in values if v]
        ratios = [v / b for v, b in zip(values, base) if v and b]
        if not ok:
            print(f"{name:24s}{'failed':>9s}")
            continue
        print(f"{name:24s}{statistics.median(ok):9.3f}{f'{min(ok):.3f}-{max(ok):.3f}':>16s}"
              f"{statistics.median(ratios):13.2f}{f'{min(ratios):.2f}-{max(ratios):.2f}':>14s}")
    (out / "large-image-speed.json").write_text(json.dumps({"side": a.side, "samples_per_s": rates}, indent=1))
    print(f"wrote {out / 'large-image-speed.json'}")


if __name__ == "__main__":
    main()
