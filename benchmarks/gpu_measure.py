"""Measure ResNet-50 training on the GPU at hand: steady samples/s, the step's phases and the CUDA allocator's
peak per rank, for the configurations that the data-sheet basis and the memory model are checked against
(docs/predict-validation.md, "A held-out GPU"). Each configuration is a plain `scaletrain train` run on
synthetic data; the rows are written to OUT/gpu-runs.json and printed as a table.

    python benchmarks/gpu_measure.py --out DIR [--only NAMES] [--rounds N]

Rounds run every chosen configuration once in the same order (interleaved), so that repeats of one
configuration are minutes apart, not back to back. The rows are written after each run. `--trace` wraps two
late steps of each run in torch.profiler and adds how busy the GPU was in them (profiler/device_busy.py): a
busy fraction well below 1 is a step the host's launches set, which no roofline prices.

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
# A name without a model prefix is ResNet-50 (--model); the others are networks no published row holds.
CONFIGS = (
    ("fp32-b256", ["--precision", "fp32", "--batch-size", "256"]),
    ("fp16-b256", ["--precision", "fp16", "--batch-size", "256"]),
    ("bf16-b256", ["--precision", "bf16", "--batch-size", "256"]),
    ("fp32-b64", ["--precision", "fp32", "--batch-size", "64"]),
    ("fp16-b64", ["--precision", "fp16", "--batch-size", "64"]),
    ("fsdp-fp32-b64", ["--precision", "fp32", "--batch-size", "64", "--strategy", "fsdp"]),
    ("fsdp-fp32-b256", ["--precision", "fp32", "--batch-size", "256", "--strategy", "fsdp"]),
    ("resnet18-fp32-b256", ["--model", "resnet18", "--precision", "fp32", "--batch-size", "256"]),
    ("resnet18-fp16-b256", ["--model", "resnet18", "--precision", "fp16", "--batch-size", "256"]),
    ("vgg16-fp32-b128", ["--model", "vgg16", "--precision", "fp32", "--batch-size", "128"]),
    ("vgg16-bf16-b128", ["--model", "vgg16", "--precision", "bf16", "--batch-size", "128"]),
)
STEPS = 40


def run(name: str, flags: list[str], out: Path, a, round_: int) -> dict:
    batch = int(flags[flags.index("--batch-size") + 1])
    rundir = out / f"{name}-r{round_}"
    model = [] if "--model" in flags else ["--model", a.model]
    window = (a.steps - 4, a.steps - 2)  # two steady steps before the last (the run's last step flushes)
    trace = ["--torch-profile", f"{window[0]}:{window[1]}"] if a.trace else []
    cmd = [sys.executable, "-m", "scaletrain", "train", *model, "--image-size", str(a.image_size),
           "--dataset", "synthetic", "--synthetic-samples", str(batch * a.steps), "--synthetic-classes", "1000",
           "--epochs", "1", "--workers", str(a.workers), "--device", a.device, "--no-progress", "--tensorboard", "off",
           "--out", str(rundir), *trace, *flags]
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(cmd[2:])}", flush=True)
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", flush=True)
        return {"name": name, "round": round_, "error": done.returncode, "wall_s": wall}
    s = json.loads((rundir / "summary.json").read_text())
    row = {"name": name, "round": round_, "flags": flags, "wall_s": wall,
           **{k: s.get(k) for k in ("samples_per_s", "step_time_mean_s", "phases_mean_s", "peak_memory_bytes",
                                    "memory_kind", "steps", "global_batch", "precision", "torch_version")}}
    if a.trace:
        from scaletrain.profiler.device_busy import device_busy

        path = rundir / "torch-profile" / "rank0.json"
        row["device_busy"] = device_busy(json.loads(path.read_text()), window[1] - window[0]) if path.exists() else None
        if row["device_busy"]:
            print(f"    GPU busy {row['device_busy']['busy_fraction']:.0%} of the traced steps, "
                  f"{row['device_busy']['kernels_per_step']:.0f} kernels per step", flush=True)
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
    p.add_argument("--rounds", type=int, default=1, help="interleaved repeats of the chosen configurations")
    p.add_argument("--trace", action="store_true", help="profile two late steps: how busy the GPU was")
    a = p.parse_args()
    import torch

    a.out.mkdir(parents=True, exist_ok=True)
    env = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none", "torch": torch.__version__,
           "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
           "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32, "cpu_count": os.cpu_count()}
    print(env, flush=True)
    only = set(filter(None, a.only.split(",")))
    unknown = only - {n for n, _ in CONFIGS}
    if unknown:
        raise SystemExit(f"gpu_measure: unknown configuration(s) {', '.join(sorted(unknown))}: choose from "
                         f"{', '.join(n for n, _ in CONFIGS)}")
    rows = []
    for round_ in range(a.rounds):
        for name, flags in CONFIGS:
            if not only or name in only:
                rows.append(run(name, flags, a.out, a, round_))
                (a.out / "gpu-runs.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
