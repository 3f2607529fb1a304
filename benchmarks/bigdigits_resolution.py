"""Resolution matters on bigdigits: ResNet-20 trained on `bigdigits:SIZE` at full size, against the same model on
the canvas downsampled 8x (where the digit is 2 x 2 pixels), same epochs and seed, and the full-size run again on
N spatial tiles (N ranks; `--spatial 0` leaves it out).

    .venv/bin/python benchmarks/bigdigits_resolution.py [--size 64] [--epochs 10] [--spatial 2] [--out DIR]
    # about 6 min on 2 cores, 2 of them without the tiles' run

Prints top-1 on the 360 validation canvases of each, and writes DIR/bigdigits-resolution.json; docs/datasets.md
keeps the results."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def runs(size: int, spatial: int) -> dict[str, list[str]]:
    """Run name -> its flags beyond the common ones."""
    chosen = {
        "full size, 1 process": ["--image-size", str(size), "--nproc", "1"],
        "downsampled 8x, 1 process": ["--image-size", str(size // 8), "--nproc", "1"],
    }
    if spatial > 1:
        chosen[f"full size, {spatial} spatial tiles"] = ["--image-size", str(size), "--strategy", "spatial",
                                                        "--spatial", str(spatial), "--nproc", str(spatial),
                                                        "--threads", "1"]
    return chosen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--spatial", type=int, default=2, help="also train at full size on this many tiles (0: not)")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="bigdigits-"))
    results = {}
    for name, flags in runs(a.size, a.spatial).items():
        print(f"  {name} ...", flush=True)
        run = out / name.replace(",", "").replace(" ", "-")
        argv = [sys.executable, "-m", "scaletrain", "train", "--model", "resnet20", "--dataset", f"bigdigits:{a.size}",
                "--epochs", str(a.epochs), "--batch-size", "32", "--tensorboard", "off", "--no-progress",
                *flags, "--out", str(run)]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode:
            results[name] = {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
            continue
        s = json.loads((run / "summary.json").read_text())
        results[name] = {"top1": s["top1"], "best_top1": s["best_top1"], "image_size": s.get("image_size"),
                         "wall_time_s": s["wall_time_s"]}
    print(f"\nbigdigits:{a.size}, ResNet-20, {a.epochs} epochs, batch 32 per replica (chance: 10%)")
    for name, r in results.items():
        print(f"  {name:30s}" + (f"top-1 {r['top1']:.1%}  ({r['wall_time_s']:.0f} s)" if "top1" in r else r["error"]))
    (out / "bigdigits-resolution.json").write_text(json.dumps({"size": a.size, "epochs": a.epochs, "runs": results},
                                                             indent=1))
    print(f"wrote {out / 'bigdigits-resolution.json'}")


if __name__ == "__main__":
    main()
