"""`scaletrain calibrate`: measure this machine once for the performance model (docs/predict.md).

What it measures, in order (a rich progress bar over all of it):
  layers     forward and backward seconds of every op kind over grid.py's shapes, at each precision the
             device runs (CPU: fp32, bf16; CUDA: fp32, bf16, fp16) and each thread count (1 and all cores)
  optimizer  optimizer.step() of each --optimizer over parameter sets of several sizes and counts
  loader     seconds per sample of each dataset kind (an image folder written from digits at several
             sizes, digits, synthetic), and loader worker start-up and hand-over
  network    commbench between 2 local ranks: the alpha-beta of allreduce, ring and a parameter server
  loop       two real `scaletrain train` runs of the reference network (predict/refnet.py) on 1 and 2
             ranks: what the training loop adds to the ops' own times, and the resident memory baseline
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import scaletrain
from scaletrain.predict import grid
from scaletrain.predict.calibration import FORMAT, KIND
from scaletrain.predict.ops import build_op
from scaletrain.predict.timing import median_time, time_op

OPTIMIZERS = ("sgd", "nesterov", "adamw", "adagrad")
REFNET = "scaletrain.predict.refnet:build"
LOOP_RUN = {"batch_size": 32, "image_size": 32, "samples": 2048}


def plan(quick: bool, device: torch.device, cores: int) -> dict[str, Any]:
    """What a calibration measures: precisions, thread counts, shapes per kind."""
    precisions = ["fp32", "bf16", "fp16"] if device.type == "cuda" else ["fp32", "bf16"]
    if quick:
        precisions = ["fp32"]
    threads = sorted({1, cores}) if device.type == "cpu" else [cores]
    counts = {k: max(6, n // 5) if quick else n for k, n in grid.COUNTS.items()}
    return {"precisions": precisions, "threads": threads, "counts": counts}


def calibrate(*, quick: bool, device: torch.device, cores: int, work_dir: Path,
              progress: Callable[[str, int, int], None] = lambda *a: None) -> dict[str, Any]:
    p = plan(quick, device, cores)
    shapes = {kind: grid.shapes(kind, n) for kind, n in p["counts"].items()}
    # the reference network's own ops too: its loop factor must measure the loop, not the regression's error
    for op in _refnet_ops():
        if op.kind in shapes and op.features not in shapes[op.kind]:
            shapes[op.kind].append(op.features)
    layer_jobs = [(prec, t, kind, f) for prec in p["precisions"] for t in p["threads"]
                  for kind in shapes for f in shapes[kind]]
    total = len(layer_jobs) + len(OPTIMIZERS) * len(p["threads"]) + 4 + 1 + 2
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        progress(what, done, total)

    started = time.time()
    steady_allocator()
    layers = []
    for prec, threads, kind, f in layer_jobs:
        torch.set_num_threads(threads)
        module, inputs = build_op(kind, f)
        fwd, bwd = time_op(module, inputs, precision=prec, input_grad=bool(f.get("grad_in", 1)), device=device,
                           repeats=3 if quick else 5)
        layers.append({"kind": kind, "precision": prec, "threads": threads, "features": f,
                       "forward_s": fwd, "backward_s": bwd})
        tick(f"layers {prec} {threads}t {kind}")
    optimizer = []
    for threads in p["threads"]:
        torch.set_num_threads(threads)
        for name in OPTIMIZERS:
            optimizer += _optimizer_rows(name, threads, device, quick)
            tick(f"optimizer {name} {threads}t")
    torch.set_num_threads(max(p["threads"]))
    loader = _loader(work_dir / "loader", quick, tick)
    network = _network(work_dir / "commbench", quick)
    tick("network")
    loop = [_loop_run(work_dir / f"loop-{n}", n, quick) for n in (1, 2)]
    tick("loop 1 rank")
    tick("loop 2 ranks")
    return {"format": FORMAT, "kind": KIND, "scaletrain_version": scaletrain.__version__,
            "torch_version": torch.__version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": round(time.time() - started, 1), "quick": quick,
            "device": _device_info(device, cores), "threads": p["threads"], "precisions": p["precisions"],
            "layers": layers, "optimizer": optimizer, "loader": loader, "network": network,
            "loop": {"runs": loop, "refnet": REFNET, **LOOP_RUN},
            "memory": {"baseline_rss_bytes": loop[0].get("peak_memory_bytes")}}


def _refnet_ops():
    from scaletrain.predict import refnet
    from scaletrain.predict.ops import trace_ops

    size = LOOP_RUN["image_size"]
    return trace_ops(refnet.build(10, 3, size), (3, size, size), LOOP_RUN["batch_size"]).ops


def steady_allocator() -> None:
    """Keep glibc from mapping and unmapping large buffers on every call (and trimming the heap), so each op
    is timed as in a training process whose allocator has settled, not with page faults that depend on which
    shapes ran before it (they made single timings 6-9x apart here)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(-1, 1 << 31)  # M_TRIM_THRESHOLD: 2 GiB
        libc.mallopt(-3, 1 << 25)  # M_MMAP_THRESHOLD: 32 MiB, glibc's largest
    except (OSError, AttributeError):
        pass


def _device_info(device: torch.device, cores: int) -> dict[str, Any]:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        memory = torch.cuda.get_device_properties(device).total_memory
    else:
        name = _cpu_name()
        memory = None
    return {"type": device.type, "name": name, "cores": cores, "memory_bytes": memory,
            "host": platform.node()}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


# ------------------------------------------------------------------ optimizer
def _optimizer_rows(name: str, threads: int, device: torch.device, quick: bool) -> list[dict[str, Any]]:
    from scaletrain.config.sections import OptimConfig
    from scaletrain.train.optim import optimizer_for

    sets = [(8, 1 << 12), (32, 1 << 12), (8, 1 << 18), (64, 1 << 14), (16, 1 << 20)]
    if quick:
        sets = sets[:3]
    rows = []
    for tensors, numel in sets:
        params = [torch.zeros(numel // tensors, device=device, requires_grad=True) for _ in range(tensors)]
        for q in params:
            q.grad = torch.randn_like(q)
        opt = optimizer_for(OptimConfig(optimizer=name), params, [True] * tensors, 0.01)
        seconds = median_time(opt.step, 3 if quick else 5, 0.02,
                              torch.cuda.synchronize if device.type == "cuda" else None)
        rows.append({"optimizer": name, "threads": threads, "tensors": tensors, "numel": numel, "seconds": seconds})
    return rows


# ------------------------------------------------------------------ loader
def _loader(work: Path, quick: bool, tick: Callable[[str], None]) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    from scaletrain.data import collate, write_imagefolder
    from scaletrain.data.registry import build_datasets

    rows = []

    def per_sample(dataset, batch: int = 32) -> float:
        loader = DataLoader(dataset, batch_size=batch, shuffle=True, collate_fn=collate, drop_last=True,
                            generator=torch.Generator().manual_seed(0))
        it = iter(loader)
        next(it)
        t0, n = time.perf_counter(), 0
        for _ in range(6 if quick else 15):
            try:
                next(it)
            except StopIteration:
                break
            n += 1
        return (time.perf_counter() - t0) / max(1, n) / batch

    for size in ((16, 32) if quick else (16, 32, 64)):
        for kind in ("digits", "synthetic"):
            data = build_datasets(kind, image_size=size, synthetic_samples=2048)
            rows.append({"dataset": kind, "image_size": size, "source_pixels": size * size,
                         "channels": data.in_channels, "seconds_per_sample": per_sample(data.train)})
    tick("loader digits, synthetic")
    folders = {}
    for size in ((64,) if quick else (32, 64, 128)):
        folder = work / f"digits-{size}"
        if not (folder / "train").is_dir():
            write_imagefolder(source="digits", out=folder, image_size=size, copies=1, seed=0, quality=90)
        folders[size] = folder
        for out_size in sorted({size, max(16, size // 2)}):
            data = build_datasets(f"imagefolder:{folder}", image_size=out_size)
            rows.append({"dataset": "imagefolder", "image_size": out_size, "source_pixels": size * size,
                         "channels": 3, "seconds_per_sample": per_sample(data.train)})
    tick("loader image folders")
    workers = []
    folder = folders[64]
    data = build_datasets(f"imagefolder:{folder}", image_size=64)
    for k in (1, 2):
        loader = DataLoader(data.train, batch_size=32, shuffle=True, collate_fn=collate, drop_last=True,
                            num_workers=k, generator=torch.Generator().manual_seed(0))
        t0 = time.perf_counter()
        it = iter(loader)
        next(it)
        first = time.perf_counter() - t0
        t1, n = time.perf_counter(), 0
        for _ in range(10 if quick else 25):
            try:
                next(it)
            except StopIteration:
                break
            n += 1
        workers.append({"workers": k, "batch_size": 32, "image_size": 64, "source_pixels": 64 * 64,
                        "first_batch_s": first, "per_batch_s": (time.perf_counter() - t1) / max(1, n)})
        del it, loader
    tick("loader workers")
    return {"rows": rows, "workers": workers, "fit": fit_loader(rows)}


def fit_loader(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per dataset kind, seconds per sample = a + b x source pixels + c x output pixels (least squares, >= 0)."""
    fits = {}
    for kind in sorted({r["dataset"] for r in rows}):
        mine = [r for r in rows if r["dataset"] == kind]
        a = np.array([[1.0, r["source_pixels"], r["image_size"] ** 2] for r in mine])
        t = np.array([r["seconds_per_sample"] for r in mine])
        from scipy.optimize import nnls

        coef, _ = nnls(a, t)
        fits[kind] = [float(c) for c in coef]
    return fits


# ------------------------------------------------------------------ network
def _network(work: Path, quick: bool) -> dict[str, Any]:
    sizes = "4K,64K,1M,4M" if quick else "4K,64K,256K,1M,4M,16M"
    cmd = [sys.executable, "-m", "scaletrain", "commbench", "--nproc", "2", "--strategies", "allreduce,ring,ps",
           "--sizes", sizes, "--seconds", "0.1" if quick else "0.3", "--out", str(work)]
    result = _run(cmd)
    if result.returncode != 0 or not (work / "commbench.json").is_file():
        return {"fits": {}, "error": _last_line(result)}
    data = json.loads((work / "commbench.json").read_text())
    return {"fits": data["fits"], "rows": data["rows"]}


# ------------------------------------------------------------------ the loop, for real
def _loop_run(out: Path, nproc: int, quick: bool) -> dict[str, Any]:
    samples = LOOP_RUN["samples"] // (2 if quick else 1)
    cmd = [sys.executable, "-m", "scaletrain", "train", "--model", REFNET, "--dataset", "synthetic",
           "--synthetic-samples", str(samples), "--image-size", str(LOOP_RUN["image_size"]),
           "--batch-size", str(LOOP_RUN["batch_size"]), "--epochs", "1", "--nproc", str(nproc),
           "--no-augment", "--no-progress", "--tensorboard", "off", "--out", str(out)]
    result = _run(cmd)
    summary_path = out / "summary.json"
    if result.returncode != 0 or not summary_path.is_file():
        return {"nproc": nproc, "error": _last_line(result)}
    s = json.loads(summary_path.read_text())
    return {"nproc": nproc, "threads": s.get("threads_per_rank"), "phases_mean_s": s.get("phases_mean_s"),
            "step_time_mean_s": s.get("step_time_mean_s"), "peak_memory_bytes": s.get("peak_memory_bytes"),
            "memory_kind": s.get("memory_kind"), "comm_total_mean_s": s.get("comm_total_mean_s"),
            "bytes_sent_per_step": s.get("bytes_sent_per_step")}


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    from scaletrain.dist.env import child_env

    return subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=900)


def _last_line(result: subprocess.CompletedProcess) -> str:
    lines = (result.stderr or result.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {result.returncode}"


def scratch() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="scaletrain-calibrate-")
