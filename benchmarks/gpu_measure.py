"""Measure ResNet-50 training on the GPU at hand: steady samples/s, the step's phases and the CUDA allocator's
peak per rank, for the configurations that the data-sheet basis and the memory model are checked against
(docs/predict-validation.md, "A held-out GPU"). Each configuration is a plain `scaletrain train` run on
synthetic data; the rows are written to OUT/gpu-runs.json and printed as a table.

    python benchmarks/gpu_measure.py --out DIR [--quick]

benchmarks/gpu_compare.py then prices the same configurations with `predict --hardware` on any machine
and prints predicted against measured."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# (name, extra flags): batch 256 at 224 px is NVIDIA's published setting for ResNet-50 v1.5 on 80 GB parts.
CONFIGS = (
    ("fp32-b256", ["--precision", "fp32", "--batch-size", "256"]),
    ("fp16-b256", ["--precision", "fp16", "--batch-size", "256"]),
    ("bf16-b256", ["--precision", "bf16", "--batch-size", "256"]),
    ("fp32-b64", ["--precision", "fp32", "--batch-size", "64"]),
    ("fsdp-fp32-b64", ["--precision", "fp32", "--batch-size", "64", "--strategy", "fsdp"]),
)
STEPS = 40


def run(name: str, flags: list[str], out: Path, a) -> dict:
    batch = int(flags[flags.index("--batch-size") + 1])
    rundir = out / name
    cmd = [sys.executable, "-m", "scaletrain", "train", "--model", a.model, "--image-size", str(a.image_size),
           "--dataset", "synthetic", "--synthetic-samples", str(batch * a.steps), "--synthetic-classes", "1000",
           "--epochs", "1", "--workers", str(a.workers), "--device", a.device, "--no-progress",
           "--out", str(rundir), *flags]
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(cmd[2:])}", flush=True)
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", flush=True)
        return {"name": name, "error": done.returncode, "wall_s": wall}
    s = json.loads((rundir / "summary.json").read_text())
    row = {"name": name, "flags": flags, "wall_s": wall,
           **{k: s.get(k) for k in ("samples_per_s", "step_time_mean_s", "phases_mean_s", "peak_memory_bytes",
                                    "memory_kind", "steps", "global_batch", "precision", "torch_version")}}
    print(f"    {row['samples_per_s']:.0f} samples/s, step {1e3 * row['step_time_mean_s']:.1f} ms, "
          f"peak {row['peak_memory_bytes'] / 2**30:.2f} GiB ({row['memory_kind']}), wall {wall:.0f} s", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workers", type=int, default=min(12, (os.cpu_count() or 2) - 2))
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--device", default="cuda", help="cpu only to try this script")
    p.add_argument("--only", default="", help="comma-separated configuration names")
    a = p.parse_args()
    import torch

    a.out.mkdir(parents=True, exist_ok=True)
    env = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none", "torch": torch.__version__,
           "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
           "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32, "cpu_count": os.cpu_count()}
    print(env, flush=True)
    only = set(filter(None, a.only.split(",")))
    rows = [run(n, f, a.out, a) for n, f in CONFIGS if not only or n in only]
    (a.out / "gpu-runs.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
