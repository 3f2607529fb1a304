"""`scaletrain calibrate`: measure this machine once for the performance model (docs/predict.md).

What it measures, in order (told to `progress` as it goes: a bar on a terminal, lines in a log):
  layers     forward and backward seconds of every op kind over grid.py's shapes, at each precision the
             device runs (CPU: fp32, bf16; CUDA: fp32, bf16, fp16) and each thread count (1 and all cores)
  optimizer  optimizer.step() of each --optimizer over parameter sets of several sizes and counts
  host work  what a strategy's step does on the host beyond ops, collectives and that law (Strategy.host_work: a
             parameter server's packing, FSDP's optimizer on DTensor shards, DDP's copies into its buckets and
             back), over parameter sets alike
  loader     seconds per sample of each dataset kind (an image folder written from digits at several
             sizes, digits, synthetic), and loader worker start-up and hand-over
  network    commbench between 2 local ranks: the alpha-beta of allreduce, ring, a parameter server, fp16 and bf16
             compression's whole exchange (cast, all-reduce, cast back) and a halo
             swap between neighbours that compute between swaps
  loop       real `scaletrain train` runs of the reference networks (predict/refnet.py): each of the three on
             1 rank (3 times each: one run varies ~10% here), the mixed one on 2 ranks at two batch sizes:
             what a training step adds to its ops' isolated times per group of ops, the exposed
             communication the bucket model does not explain, and the resident memory baseline
  probe      the speed probe (predict/probe.py) before, between and after the op grid, and at the end
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import scaletrain
from scaletrain.distributed.allocator import settle
from scaletrain.predict import grid, probe, refnet, regress
from scaletrain.predict.calibration import FORMAT, KIND
from scaletrain.perf.timing import median_time
from scaletrain.predict.timing import conventions, harness_excess, time_grid_op
from scaletrain.rundir import COMMBENCH, read_summary

OPTIMIZERS = ("sgd", "nesterov", "adamw", "adagrad")
REFNET = "scaletrain.predict.refnet:build"
LOOP_RUN = {"batch_size": 32, "image_size": 32, "samples": 2048, "min_samples": 512}  # (batch 2: 256 steps, not 64)
# (reference network, ranks, batch per rank, runs, loader workers, threads per rank or None for the cores
# shared out): the three networks on 1 rank separate the loop factors of compute- and memory-bound ops;
# refnet on 1 rank at one thread, then on 2 ranks at one thread each, is how much slower a rank computes
# when every core is busy (the ratio of the two, the same ops at the same threads: docs/predict.md); two
# batches on 2 ranks separate the exposed communication that grows with the step's compute (ranks out of
# step) from the part that does not (four runs each: one run's exposed communication moves 25% from the next's)
LOOP_RUNS = (("refnet", 1, 32, 3, 0, None), ("plain", 1, 32, 3, 0, None), ("memory", 1, 32, 3, 0, None),
             ("refnet", 1, 32, 4, 0, 1), ("refnet", 2, 32, 4, 0, None), ("refnet", 2, 8, 4, 0, None),
             ("refnet", 1, 2, 4, 0, 1), ("refnet", 2, 2, 4, 0, None))
# LOOP_RUNS run alternately (r0 of each, then r1, ...): the slowdown pairs at batch 32 (3, 4) and 2 (6, 7), whose
# ratios pair by round (at batch 2 a step's constant on two ranks weighs 10x what it does at 32), and the batches on
# 2 ranks, whose line over the step's compute the machine's drift would otherwise tilt
INTERLEAVED = (3, 4, 5, 6, 7)
# (a run with one loader worker beside the rank's threads once priced a worker's interference; predict no
# longer reads it: the CPU-demand rule was closer in every recorded study, docs/predict.md)


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
    hosts = _host_strategies()
    total = len(layer_jobs) + (len(OPTIMIZERS) + 1 + len(hosts)) * len(p["threads"]) + 4 + 1 + \
        sum(loop_rounds(quick)) + 1
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        progress(what, done, total)

    started = time.time()
    # glibc's heap keeps what each op frees, so each op is timed as in a training process whose allocator has
    # settled, not with page faults that depend on which shapes ran before it (single timings 6-9x apart here)
    settle("steady")
    probes = [probe.measure(p["threads"], device)]
    layers = []
    for i, (prec, threads, kind, f) in enumerate(layer_jobs):
        if i and i % max(1, len(layer_jobs) // 4) == 0:
            probes.append(probe.measure(p["threads"], device))
        torch.set_num_threads(threads)
        fwd, bwd = time_grid_op(kind, f, precision=prec, device=device, repeats=3 if quick else 5)
        layers.append({"kind": kind, "precision": prec, "threads": threads, "features": f,
                       "forward_s": fwd, "backward_s": bwd})
        tick(f"layers {prec} {threads}t {kind}")
    optimizer = []
    for threads in p["threads"]:
        torch.set_num_threads(threads)
        for name in OPTIMIZERS:
            optimizer += _optimizer_rows(name, threads, device, quick)
            tick(f"optimizer {name} {threads}t")
    host_work: dict[str, list[dict[str, Any]]] = {}
    for threads in p["threads"]:
        torch.set_num_threads(threads)
        for key, cls in hosts.items():
            host_work.setdefault(key, []).extend(cls.host_work(device, threads, quick))
            tick(f"host work {key} {threads}t")
    harness = {}
    for threads in p["threads"]:
        torch.set_num_threads(threads)
        harness[str(threads)] = harness_excess(device, rounds=5 if quick else 9)
        tick(f"timing's own overhead {threads}t")
    probes.append(probe.measure(p["threads"], device))
    after_grid = probes[-1]
    torch.set_num_threads(max(p["threads"]))
    loader = _loader(work_dir / "loader", quick, tick)
    network = _network(work_dir / "commbench", quick)
    tick("network")
    pages = _fresh_pages()
    tick("fresh pages")
    loop = _loop(work_dir, quick, tick)
    after_loop = probe.measure(p["threads"], device)
    torch.set_num_threads(max(p["threads"]))
    fits = regress.fit_records(layers)  # each law cross-validated once, here: predict reads its error
    tick("time laws cross-validated")
    return {"format": FORMAT, "kind": KIND, "scaletrain_version": scaletrain.__version__,
            "torch_version": torch.__version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": round(time.time() - started, 1), "quick": quick,
            "device": _device_info(device, cores), "threads": p["threads"], "precisions": p["precisions"],
            **conventions(), "layers": layers, "fits": fits, "harness": harness,
            "optimizer": optimizer, "host_work": host_work, "loader": loader, "network": network,
            "loop": {"runs": loop, "refnet": REFNET, "nets": {k: f"scaletrain.predict.refnet:{v}"
                                                                 for k, v in refnet.NETS.items()}, **LOOP_RUN},
            "memory": {"baseline_rss_bytes": loop[0].get("peak_memory_bytes"), "fresh_pages": pages},
            "probe": _probe_summary(probes, [after_grid, after_loop])}


def _host_strategies() -> dict[str, type]:
    """The strategies whose step does host work of its own to time (comm/registry.py), one per `host_key`."""
    from scaletrain.comm.registry import STRATEGIES, strategy_class

    out: dict[str, type] = {}
    for name in STRATEGIES:
        cls = strategy_class(name)
        if cls.host_key:
            out.setdefault(cls.host_key, cls)
    return out


def _probe_summary(grid_probes: list[dict[str, float]], loop_probes: list[dict[str, float]]) -> dict[str, Any]:
    """The probes taken along the op grid: their mean per thread count (the speed the op times hold, which
    `predict` compares with) and spread (how much the machine's speed moved meanwhile); and the mean of
    the two around the loop runs (the speed they ran at)."""
    keys = grid_probes[0].keys()
    mean = {t: float(np.mean([p[t] for p in grid_probes])) for t in keys}
    spread = {t: float((max(p[t] for p in grid_probes) - min(p[t] for p in grid_probes)) / mean[t]) for t in keys}
    return {"batch_size": probe.BATCH, "image_size": probe.SIZE, "grid_s": grid_probes, "mean_s": mean,
            "spread": spread, "loop_mean_s": {t: float(np.mean([p[t] for p in loop_probes])) for t in keys}}


def _refnet_ops():
    from scaletrain.predict.ops import trace_ops

    size = LOOP_RUN["image_size"]
    return [op for name in refnet.NETS
            for op in trace_ops(refnet.factory(name)(10, 3, size), (3, size, size), LOOP_RUN["batch_size"]).ops]


def _fresh_pages() -> dict[str, Any]:
    """Seconds per byte of fresh pages under each CPU allocator policy (distributed/pages.py), each measured in a
    process started with the policy's environment; {} where it could not be measured."""
    from scaletrain.distributed.allocator import rank_environment
    from scaletrain.distributed.env import child_env

    out = {}
    for policy in ("steady", "lean"):
        env = {**child_env(), **rank_environment(policy)}
        done = subprocess.run([sys.executable, "-m", "scaletrain.distributed.pages", policy], capture_output=True,
                              text=True, env=env, timeout=300)
        if done.returncode == 0 and done.stdout.strip():
            out[policy] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _device_info(device: torch.device, cores: int) -> dict[str, Any]:
    from scaletrain.predict.l2 import l2_bytes

    memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    return {"type": device.type, "name": probe.device_name(device), "cores": cores, "memory_bytes": memory,
            "l2_bytes": l2_bytes() if device.type == "cpu" else None,  # what a step fetches cold per op (l2.py)
            "host": platform.node(), **settle()}  # the allocator the op times were measured under


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
    from scaletrain.data import write_imagefolder
    from scaletrain.data.registry import build_datasets

    rows = []

    def per_sample(dataset, batch: int = 32) -> float:
        return seconds_per_sample(dataset, batch, 6 if quick else 15)

    for size in ((16, 32) if quick else (16, 32, 64)):
        for kind in ("digits", "synthetic"):
            data = build_datasets(kind, image_size=size, synthetic_samples=2048)
            # batch 128 beside 32 at one size: what a batch costs beyond its samples (sampler, collate)
            for batch in ((32, 128) if size == 32 else (32,)):
                rows.append({"dataset": kind, "image_size": size, "source_pixels": size * size, "batch_size": batch,
                             "channels": data.in_channels, "seconds_per_sample": per_sample(data.train, batch)})
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
                         "batch_size": 32, "channels": 3, "seconds_per_sample": per_sample(data.train)})
    tick("loader image folders")
    data = build_datasets(f"imagefolder:{folders[64]}", image_size=64)
    batches = 10 if quick else 25
    ones, handoffs = [], []
    for _ in range(3):  # a worker's batches against the same batches made in this process, alternated
        in_process = seconds_per_sample(data.train, 32, batches) * 32
        first, per_batch, it = _worker_batches(data.train, 1, batches)
        ones.append((first, per_batch))
        handoffs.append(per_batch - in_process)
    receive = _receive_s(it, per_batch, 4 if quick else 8)
    del it
    first2, per_batch2, it = _worker_batches(data.train, 2, batches)
    del it
    shape = {"batch_size": 32, "image_size": 64, "source_pixels": 64 * 64}
    workers = [{"workers": 1, **shape, "first_batch_s": statistics.median(f for f, _ in ones),
                "per_batch_s": statistics.median(b for _, b in ones), "receive_s": receive,
                "handoff_s": max(0.0, statistics.median(handoffs))},
               {"workers": 2, **shape, "first_batch_s": first2, "per_batch_s": per_batch2}]
    tick("loader workers")
    return {"rows": rows, "workers": workers, "fit": fit_loader(rows)}


def _worker_batches(dataset, workers: int, batches: int, batch: int = 32):
    """(the first batch's seconds, seconds per batch after it, the iterator) through `workers` loader workers, the
    main process only taking the batches (none: the main process makes them)."""
    from torch.utils.data import DataLoader

    from scaletrain.data import collate

    loader = DataLoader(dataset, batch_size=batch, shuffle=True, collate_fn=collate, drop_last=True,
                        num_workers=workers, generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t0
    t1, n = time.perf_counter(), 0
    for _ in range(batches):
        try:
            next(it)
        except StopIteration:
            break
        n += 1
    return first, (time.perf_counter() - t1) / max(1, n), it


def _receive_s(it, per_batch_s: float, batches: int) -> float:
    """The rank's own part of a worker's batch: taking one already made off the queue (median over `batches`,
    each after a pause of three batches' making, so that it waits made)."""
    times = []
    for _ in range(batches):
        time.sleep(3 * per_batch_s)
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        times.append(time.perf_counter() - t0)
    return statistics.median(times) if times else 0.0


def seconds_per_sample(dataset, batch: int, batches: int) -> float:
    """Seconds per sample of the main process reading `batches` batches (after a first) through a DataLoader
    without workers: read, decode, augment and collate on this process's threads."""
    return _worker_batches(dataset, 0, batches, batch)[1] / batch


def fit_loader(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per dataset kind, seconds per sample = a + b x source pixels + c x output pixels + d / batch (least
    squares, >= 0; d, a batch's own cost, only where two batch sizes were measured)."""
    fits = {}
    for kind in sorted({r["dataset"] for r in rows}):
        mine = [r for r in rows if r["dataset"] == kind]
        batches = len({r.get("batch_size", 32) for r in mine}) > 1
        a = np.array([[1.0, r["source_pixels"], r["image_size"] ** 2, 1.0 / r.get("batch_size", 32) if batches else 0.0]
                      for r in mine])
        t = np.array([r["seconds_per_sample"] for r in mine])
        from scipy.optimize import nnls

        coef, _ = nnls(a, t)
        fits[kind] = [float(c) for c in coef]
    return fits


# ------------------------------------------------------------------ network
HALO_LAUNCHES = 5
"""Separate launches of commbench's halo swap, whose fit is their median: one launch's latency moved 0.6-2.1 ms
here from one launch to the next (19 launches: 14 in 1.3-2.1 ms, 5 in 0.6-0.8 ms; both ranks alike within a
launch), far more than within a launch; spatial training runs measured 1.46-1.66 ms per exchange (4 runs)."""


def _network(work: Path, quick: bool) -> dict[str, Any]:
    sizes = "4K,64K,1M,4M" if quick else "4K,64K,256K,1M,4M,16M"

    def commbench(strategies: str, out: Path) -> dict[str, Any]:
        result = _run([sys.executable, "-m", "scaletrain", "commbench", "--nproc", "2", "--strategies", strategies,
                       "--sizes", sizes, "--seconds", "0.1" if quick else "0.3", "--out", str(out)])
        if result.returncode != 0 or not (out / COMMBENCH).is_file():
            return {"fits": {}, "rows": [], "error": _last_line(result)}
        return json.loads((out / COMMBENCH).read_text())

    data = commbench("allreduce,ring,ps,fp16,bf16", work)
    if "error" in data:
        return data
    halos = [commbench("halo", work / f"halo-{i}") for i in range(HALO_LAUNCHES)]
    fits = [h["fits"]["halo"] for h in halos if "halo" in h["fits"]]
    if fits:
        data["fits"]["halo"] = {k: float(np.median([f[k] for f in fits])) for k in ("alpha_s", "beta_s_per_byte")}
        beta = data["fits"]["halo"]["beta_s_per_byte"]
        data["fits"]["halo"].update(link_bytes_per_s=1 / beta if beta > 0 else None, launches=fits)
    rows = data["rows"] + [{**r, "launch": i} for i, h in enumerate(halos) for r in h["rows"]]
    return {"fits": data["fits"], "rows": rows}


# ------------------------------------------------------------------ the loop, for real
def _loop(work_dir: Path, quick: bool, tick: Callable[[str], None]) -> list[dict[str, Any]]:
    """LOOP_RUNS' summaries in their order; the INTERLEAVED settings run alternately, one round at a time, so
    that the machine's drift over a minute falls on both sides of their ratio (and their line) alike."""
    def runs_of(i: int, k: int) -> dict[str, Any]:
        net, n, batch, _repeats, workers, threads = LOOP_RUNS[i]
        folder = work_dir / "loader" / "digits-64" if workers else None
        run = _loop_run(work_dir / f"loop-{net}-{n}-{batch}-{workers}-{threads or 0}" / f"r{k}", net, n, batch,
                        quick, folder, threads)
        tick(f"loop {net} {n} rank(s), batch {batch}" + (f", {workers} worker" if workers else "")
             + (f", {threads} thread" if threads else "") + f", run {k + 1}/{loop_rounds(quick)[i]}")
        return run

    rounds = loop_rounds(quick)
    done: dict[int, list[dict[str, Any]]] = {}
    for i in range(len(LOOP_RUNS)):
        if i in INTERLEAVED:
            if i == INTERLEAVED[0]:
                alternate: dict[int, list[dict[str, Any]]] = {j: [] for j in INTERLEAVED}
                for k in range(max(rounds[j] for j in INTERLEAVED)):
                    for j in INTERLEAVED:
                        if k < rounds[j]:
                            alternate[j].append(runs_of(j, k))
                done.update(alternate)
            continue
        done[i] = [runs_of(i, k) for k in range(rounds[i])]
    return [_summary(done[i]) for i in range(len(LOOP_RUNS))]


def loop_rounds(quick: bool) -> list[int]:
    """How many runs each of LOOP_RUNS makes (one each in a quick calibration)."""
    return [1 if quick else setting[3] for setting in LOOP_RUNS]


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs of one loop setting: their phases' medians (one process varies ~10% here), and each run's phases
    (`phases_runs_s`, by round: a ratio of two settings run alternately pairs them up)."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[0]
    first = good[0]
    median = {k: float(np.median([r["phases_mean_s"][k] for r in good])) for k in first["phases_mean_s"]}
    return {**first, "phases_mean_s": median, "runs": len(good),
            "phases_runs_s": [r["phases_mean_s"] if "error" not in r else None for r in runs],
            "step_time_mean_s": float(np.median([r["step_time_mean_s"] for r in good])),
            "step_time_runs_s": [r["step_time_mean_s"] for r in good],
            "peak_memory_bytes": float(np.median([r["peak_memory_bytes"] for r in good]))}


def _loop_run(out: Path, net: str, nproc: int, batch: int, quick: bool, folder: Path | None = None,
              threads: int | None = None) -> dict[str, Any]:
    """One run; with `folder`, on that JPEG folder with one loader worker (else synthetic data, no worker);
    `threads` per rank (None: the cores shared out, as `train` does)."""
    samples = max(LOOP_RUN["samples"] // (LOOP_RUN["batch_size"] // batch), LOOP_RUN["min_samples"])
    samples //= 2 if quick else 1
    data = ["--dataset", f"imagefolder:{folder}", "--workers", "1"] if folder else \
        ["--dataset", "synthetic", "--synthetic-samples", str(samples)]
    cmd = [sys.executable, "-m", "scaletrain", "train", "--model", f"scaletrain.predict.refnet:{refnet.NETS[net]}",
           *data, "--image-size", str(LOOP_RUN["image_size"]),
           "--batch-size", str(batch), "--epochs", "1", "--nproc", str(nproc),
           "--no-augment", "--no-progress", "--tensorboard", "off", "--out", str(out),
           *(["--threads", str(threads)] if threads else [])]
    result = _run(cmd)
    s = read_summary(out, strict=False) if result.returncode == 0 else None
    if s is None:
        return {"model": net, "nproc": nproc, "batch_size": batch, "workers": int(bool(folder)),
                "error": _last_line(result)}
    return {"model": net, "nproc": nproc, "batch_size": batch, "workers": int(bool(folder)),
            "dataset": "imagefolder" if folder else "synthetic", "source_pixels": 64 * 64 if folder else None,
            "threads": s.get("threads_per_rank"),
            "phases_mean_s": s.get("phases_mean_s"),
            "step_time_mean_s": s.get("step_time_mean_s"), "peak_memory_bytes": s.get("peak_memory_bytes"),
            "memory_kind": s.get("memory_kind"), "comm_total_mean_s": s.get("comm_total_mean_s"),
            "bytes_sent_per_step": s.get("bytes_sent_per_step")}


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    from scaletrain.distributed.env import child_env

    return subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=900)


def _last_line(result: subprocess.CompletedProcess) -> str:
    lines = (result.stderr or result.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {result.returncode}"


def scratch() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="scaletrain-calibrate-")
