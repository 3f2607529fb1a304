"""The largest image side each layout trains under a memory budget per rank, measured: ResNet-18 on synthetic
images, 2 ranks (4 for 2 x 2 tiles), batch 1 per replica (a pipeline needs a micro-batch per stage: batch 2 as 2
micro-batches of 1).

    .venv/bin/python benchmarks/largest_side.py [--budget 2GiB] [--fit 1024,1536] [--allocator lean] [--out DIR]
    # about 30 min

For each layout, `scaletrain train` (the real launcher) runs a few steps at the two `--fit` sides; its peak
resident memory (max over ranks, the profiler's) is a + b x side^2 (a: the process, weights, optimizer; b: the
activations per pixel), which gives the side that meets the budget, rounded down to a multiple of 64. That side
is then trained and its peak measured: within the budget, 64 px more is tried (up to 2 more times) until a side
is over; above it, 64 px less, again. Every run uses `--allocator` (lean by default: what a run given
--memory-per-device uses, whose resident peak is its live one; steady: every other run's default). The memory
model (`scaletrain predict --image-size max`) is shown beside it. Writes DIR/largest-side.json; docs/spatial.md
keeps the dated results."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

BUDGET = ["--memory-per-device", "2GiB"]  # (main() sets it to --budget)
STEM_ALONE = "split-stem-alone.json"  # (main() writes it in --out: ResNet-18's stem, then its other 9 blocks)
TILES_X_STAGES = ["--strategy", "spatial", "--spatial", "2", "--stages", "2", "--nproc", "4", "--batch-size", "2",
                  "--microbatches", "2", "--spatial-until", "layer3", "--split", STEM_ALONE]
LAYOUTS = {
    "DDP": ["--nproc", "2"],
    "DDP + checkpointing": ["--nproc", "2", "--checkpoint-activations", "blocks"],
    "pipeline 2": ["--strategy", "pipeline", "--nproc", "2", "--batch-size", "2", "--microbatches", "2", *BUDGET],
    "spatial 2": ["--strategy", "spatial", "--spatial", "2", "--nproc", "2"],
    "spatial 2 + checkpointing": ["--strategy", "spatial", "--spatial", "2", "--nproc", "2",
                                  "--checkpoint-activations", "blocks"],
    "spatial 4 + checkpointing": ["--strategy", "spatial", "--spatial", "4", "--nproc", "4",
                                  "--checkpoint-activations", "blocks"],
    "spatial 2 x pipeline 2": [*TILES_X_STAGES],
    "spatial 2 x pipeline 2 + checkpointing": [*TILES_X_STAGES, "--checkpoint-activations", "blocks"],
}
"""Spatial 4 and spatial 2 x pipeline 2 run 4 ranks (2 x 2 tiles of each image; 2 tiles in each of 2 stages: the
stem alone in stage 0, which holds both micro-batches in flight, the rest in stage 1, tiled up to layer3). The
pipeline 2 row's stages are split within the budget (`--memory-per-device`, which also refuses a side the memory
model says does not fit: such a side counts as not trained)."""
RUN = ["--model", "resnet18", "--dataset", "synthetic", "--synthetic-samples", "4", "--batch-size", "1",
       "--epochs", "1", "--threads", "1", "--tensorboard", "off", "--no-progress"]
STEP = 64  # sides are multiples of 64: ResNet-18 divides by 32, and 2 tiles split the width in two


def train(out: Path, layout: str, side: int) -> dict:
    argv = [sys.executable, "-m", "scaletrain", "train", *RUN, *LAYOUTS[layout], "--image-size", str(side),
            "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        return {"side": side, "error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    s = json.loads((out / "summary.json").read_text())
    return {"side": side, "peak_bytes": max(r["peak_memory_bytes"] for r in s["ranks"]),
            "samples_per_s": s.get("samples_per_s")}


def largest(layout: str, budget: int, fit: list[int], out: Path) -> dict:
    runs = [train(out / f"{layout.replace(' ', '_')}-{side}", layout, side) for side in fit]
    for r in runs:
        print(f"  {layout} at {r['side']}: " + (f"{r['peak_bytes'] / 2**20:,.0f} MiB" if "peak_bytes" in r
                                               else r["error"]), flush=True)
    if any("peak_bytes" not in r for r in runs):
        return {"runs": runs, "error": "a fit run failed"}
    (s0, p0), (s1, p1) = [(r["side"], r["peak_bytes"]) for r in runs]
    b = (p1 - p0) / (s1 ** 2 - s0 ** 2)
    a = p0 - b * s0 ** 2
    side = int(math.sqrt(max(0.0, (budget - a) / b)) // STEP * STEP)
    best, direction = None, 0
    for _ in range(4):
        r = train(out / f"{layout.replace(' ', '_')}-{side}", layout, side)
        runs.append(r)
        print(f"  {layout} at {side}: " + (f"{r['peak_bytes'] / 2**20:,.0f} MiB" if "peak_bytes" in r
                                          else r["error"]), flush=True)
        fits = "peak_bytes" in r and r["peak_bytes"] <= budget
        if fits:
            best = r
        if direction == 0:
            direction = STEP if fits else -STEP
        if (direction > 0) != fits:  # going up and over, or going down and within: the edge is found
            break
        side += direction
    if best is None:
        return {"runs": runs, "a_bytes": a, "b_bytes_per_px": b, "error": "no side confirmed"}
    return {"runs": runs, "a_bytes": a, "b_bytes_per_px": b, "largest_side": best["side"],
            "peak_bytes": best["peak_bytes"]}


def size(text: str) -> int:
    units = {"KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * factor)
    return int(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", default="2GiB")
    p.add_argument("--fit", default="1024,1536")
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--allocator", default="lean", choices=["lean", "steady"])
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    RUN.extend(["--allocator", a.allocator])
    budget, fit = size(a.budget), [int(s) for s in a.fit.split(",")]
    for flags in LAYOUTS.values():
        if "--memory-per-device" in flags:
            flags[flags.index("--memory-per-device") + 1] = a.budget
    out = a.out or Path(tempfile.mkdtemp(prefix="largest-side-"))
    out.mkdir(parents=True, exist_ok=True)
    blocks = ["stem", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1", "layer4.0",
              "layer4.1+pool", "fc"]
    split = out / STEM_ALONE
    split.write_text(json.dumps({"model": "resnet18", "blocks": blocks, "chosen": {"bounds": [[0, 1], [1, 10]]}}))
    for flags in LAYOUTS.values():
        if STEM_ALONE in flags:
            flags[flags.index(STEM_ALONE)] = str(split)
    results = {}
    for layout in a.layouts.split(","):
        results[layout] = largest(layout, budget, fit, out)
    base = results.get("DDP", {}).get("largest_side")
    print(f"\nlargest side under {a.budget} per rank (ResNet-18, batch 1 per replica; measured peak RSS)")
    print(f"{'layout':28s}{'side':>7s}{'peak':>11s}{'x DDP':>7s}{'MiB + B/px':>18s}")
    for layout, r in results.items():
        if "largest_side" not in r:
            print(f"{layout:28s}{r.get('error', 'failed'):>30s}")
            continue
        ratio = f"{r['largest_side'] / base:.2f}" if base else "-"
        print(f"{layout:28s}{r['largest_side']:7d}{r['peak_bytes'] / 2**20:8,.0f} MiB{ratio:>7s}"
              f"{r['a_bytes'] / 2**20:10,.0f} + {r['b_bytes_per_px']:5.0f}")
    (out / "largest-side.json").write_text(json.dumps({"budget_bytes": budget, "fit": fit, "allocator": a.allocator,
                                                       "results": results}, indent=1))
    print(f"wrote {out / 'largest-side.json'}")


if __name__ == "__main__":
    main()
