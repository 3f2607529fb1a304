"""Memory per rank of one large image, by layout: the whole model on one rank (DDP's per-rank share) and 2
spatial tiles, each trained a few steps of ResNet-18 at batch 1 on synthetic images with
`scaletrain train` (the real launcher), at each image side; the layouts interleaved at each side.

    .venv/bin/python benchmarks/spatial_memory.py [--sizes 1024,2048] [--out DIR]    # about 7 min here

Per rank: the peak resident set size (the profiler's, max over ranks) and its growth over the same layout's
peak at the smallest side (what the activations add: the interpreter, torch and the weights cancel), and
samples/s (2 cores shared: the tiles' 2 ranks get one each). Writes DIR/spatial-memory.json;
docs/spatial.md keeps the dated results."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

LAYOUTS = {"whole (1 rank)": ["--nproc", "1"], "spatial 2": ["--strategy", "spatial", "--spatial", "2", "--nproc", "2"]}
"""(A pipeline needs a micro-batch per stage, so a batch of 2 or more: it cannot be compared at batch 1.)"""
RUN = ["--model", "resnet18", "--dataset", "synthetic", "--synthetic-samples", "4", "--batch-size", "1",
       "--epochs", "1", "--threads", "1", "--tensorboard", "off", "--no-progress"]


def train(out: Path, layout: str, side: int) -> dict:
    argv = [sys.executable, "-m", "scaletrain", "train", *RUN, "--image-size", str(side), "--out", str(out),
            *LAYOUTS[layout]]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    s = json.loads((out / "summary.json").read_text())
    return {"peak_bytes": max(r["peak_memory_bytes"] for r in s["ranks"]), "samples_per_s": s.get("samples_per_s"),
            "spatial": s.get("spatial")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,2048")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    out = a.out or Path(tempfile.mkdtemp(prefix="spatial-memory-"))
    results: dict[str, dict[int, dict]] = {name: {} for name in LAYOUTS}
    for side in sizes:
        for name in LAYOUTS:
            print(f"  {name} at {side}x{side} ...", flush=True)
            results[name][side] = train(out / f"{name.split()[0]}-{side}", name, side)
    header = f"{'layout':16s}" + "".join(f"{f'peak @{s}':>13s}" for s in sizes) + \
        "".join(f"{f'+ @{s}':>11s}" for s in sizes[1:]) + "".join(f"{f'samples/s @{s}':>17s}" for s in sizes)
    print(header)
    for name, by_side in results.items():
        cells = []
        for s in sizes:
            r = by_side[s]
            cells.append(f"{r['peak_bytes'] / 2**20:10,.0f} MiB" if "peak_bytes" in r else f"{'failed':>13s}")
        base = by_side[sizes[0]].get("peak_bytes")
        for s in sizes[1:]:
            r = by_side[s]
            cells.append(f"{(r['peak_bytes'] - base) / 2**20:7,.0f} MiB" if base and "peak_bytes" in r else
                         f"{'-':>11s}")
        for s in sizes:
            rate = by_side[s].get("samples_per_s")
            cells.append(f"{rate:17.3f}" if rate else f"{'-':>17s}")
        print(f"{name:16s}" + "".join(cells))
    (out / "spatial-memory.json").write_text(json.dumps({"sizes": sizes, "results": results}, indent=1))
    print(f"wrote {out / 'spatial-memory.json'}")


if __name__ == "__main__":
    main()
