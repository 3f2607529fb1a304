"""scaletrain's training throughput against a minimal hand-written DDP loop (`plain_ddp.py`), and the step
profiler's cost (`--profile on` against `--profile off`), side by side in one run.

Both train the same model on the same data with the same per-rank batch, ranks, threads, optimizer, LR
schedule and precision (fp32), launched by the same elastic agent; both report steady-state samples/s as
`scaletrain.metrics` defines it (warm-up steps of each epoch excluded; no evaluation or checkpoint inside
the timed steps; TensorBoard off). Runs interleave in a rotating order (plain, on, off; on, off, plain; ...)
so that drift of a shared, noisy machine hits every side alike. Headlines: median(scaletrain, profile on) /
median(plain), target >= 0.97, and median(profile on) / median(profile off), target >= 0.98 (the profiler
costs under 2%). Each repeat also checks that the sides computed the same thing (the loss of each epoch's
last step; bit-identical on CPU). A measurement, not a test: exits 0 whatever the ratios (1 if a run fails).

    .venv/bin/python benchmarks/overhead.py                 # `make bench`: resnet20 on synthetic, 2 ranks
    .venv/bin/python benchmarks/overhead.py --repeats 5 --json bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from scaletrain.config.applies import defaults
from scaletrain.distributed import allocator

HERE = Path(__file__).resolve().parent
TARGET = 0.97  # scaletrain within 3% of the plain loop
PROFILER_TARGET = 0.98  # the step profiler costs under 2%
NOISY_SPREAD = 0.15  # (max - min) / median of one side's runs; ~7% on an idle 2-core machine
_DEFAULTS = defaults()  # every setting's default, by key
# scaletrain's ranks fix glibc's malloc thresholds (distributed/allocator.py); the plain loop gets the same through
# glibc's environment variables, so that the ratio measures the training loop, not the allocator
SAME_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(allocator.MMAP_THRESHOLD),
               "MALLOC_TRIM_THRESHOLD_": str(allocator.TRIM_THRESHOLD)}

console = Console(highlight=False)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet20", help="(default: %(default)s)")
    ap.add_argument("--dataset", default="synthetic", help="(default: %(default)s)")
    ap.add_argument("--epochs", type=int, default=2, help="(default: %(default)s)")
    ap.add_argument("--batch-size", type=int, default=_DEFAULTS["batch_size"], help="per rank (default: %(default)s)")
    ap.add_argument("--synthetic-samples", type=int, default=3072,
                    help="training samples of the synthetic dataset (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each side, interleaved (default: %(default)s)")
    ap.add_argument("--nproc", type=int, default=2, help="ranks (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=_DEFAULTS["workers"], help="data-loader processes per rank")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto: CUDA when there is a GPU per rank, else CPU")
    ap.add_argument("--json", metavar="PATH", help="write the results to this JSON file")
    args = ap.parse_args(argv)
    if min(args.epochs, args.batch_size, args.repeats, args.nproc, args.synthetic_samples) < 1 or args.workers < 0:
        ap.error("--epochs, --batch-size, --repeats, --nproc and --synthetic-samples must be at least 1")
    return args


def cpu_busy(seconds: float = 1.0) -> float | None:
    """Fraction of all CPUs' time spent busy over the next `seconds` (Linux /proc/stat; None elsewhere)."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
        return sum(ticks), ticks[3] + ticks[4]  # all, idle + iowait
    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1 - (idle1 - idle0) / max(1, total1 - total0)


def resolve_device(requested: str, nproc: int) -> str:
    if requested != "auto":
        return requested
    import torch
    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "cpu"


def shared_settings(args: argparse.Namespace, device: str) -> dict:
    """What both sides get, pinned explicitly so that a change of scaletrain's defaults cannot skew them."""
    return {"model": args.model, "dataset": args.dataset, "epochs": args.epochs, "batch_size": args.batch_size,
            "synthetic_samples": args.synthetic_samples, "workers": args.workers, "device": device,
            "lr": _DEFAULTS["lr"], "momentum": _DEFAULTS["momentum"],
            "weight_decay": _DEFAULTS["weight_decay"], "seed": _DEFAULTS["seed"]}


def _flags(s: dict) -> list[str]:
    return [a for k, v in s.items() for a in (f"--{k.replace('_', '-')}", str(v))]


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        console.print(f"[red]{what} failed (exit {proc.returncode}):[/red] {' '.join(cmd)}\n{tail}")
        sys.exit(1)


def run_plain(s: dict, nproc: int, tmp: Path) -> dict:
    out = tmp / "plain.json"
    _run([sys.executable, str(HERE / "plain_ddp.py"), "--nproc", str(nproc), *_flags(s), "--json", str(out)],
         "the plain DDP loop", env={**os.environ, **SAME_MALLOC})
    r = json.loads(out.read_text())
    return {"samples_per_s": r["samples_per_s"], "epoch_last_losses": r["epoch_last_losses"]}


def run_scaletrain(s: dict, nproc: int, tmp: Path, profile: str = "on") -> dict:
    out = tmp / "scaletrain-run"
    _run([sys.executable, "-m", "scaletrain", "train", "--nproc", str(nproc), *_flags(s),
          "--optimizer", "sgd", "--precision", "fp32", "--schedule", "cosine", "--warmup-epochs", "0",
          "--no-scale-lr", "--no-sync-bn", "--no-augment", "--no-progress", "--profile", profile,
          "--tensorboard", "off",
          "--eval-every", str(s["epochs"]), "--out", str(out)], "scaletrain train")
    summary = json.loads((out / "summary.json").read_text())
    steps = [json.loads(line) for line in (out / "metrics-rank0.jsonl").read_text().splitlines() if line]
    last = {}
    for r in steps:  # the loss of each epoch's last step, to check both sides computed the same thing
        last[r["epoch"]] = r["loss"]
    return {"samples_per_s": summary["samples_per_s"], "epoch_last_losses": [last[e] for e in sorted(last)]}


def _spread(results: list[dict]) -> float:
    rates = [r["samples_per_s"] for r in results]
    return (max(rates) - min(rates)) / statistics.median(rates)


def loss_check(plain: dict, st: dict) -> str:
    a, b = plain["epoch_last_losses"], st["epoch_last_losses"]
    if len(a) != len(b):
        return "[red]epochs differ[/red]"
    diff = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
    return "identical" if diff == 0 else f"max diff {diff:.2g}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    device = resolve_device(args.device, args.nproc)
    s = shared_settings(args, device)
    console.print(f"[bold]overhead benchmark[/bold]: {args.model} on {args.dataset}, {args.nproc} ranks x batch "
                  f"{args.batch_size} ({device}, fp32), {args.epochs} epochs; {args.repeats} interleaved repeats")
    busy = cpu_busy()
    if busy is not None and busy > 0.25:
        console.print(f"[yellow]note: the CPUs were {100 * busy:.0f}% busy just before starting: other processes "
                      "compete with the runs, so the figures will be noisy[/yellow]")
    plain, st, off = [], [], []
    total = 3 * args.repeats
    sides = [("plain", run_plain, plain), ("profile on", run_scaletrain, st),
             ("profile off", lambda *a: run_scaletrain(*a, profile="off"), off)]
    for r in range(args.repeats):
        # a rotating order: no side is always the one that runs first or last
        for name, fn, results in sides[r % 3:] + sides[:r % 3]:
            tmp = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
            t = time.perf_counter()
            try:
                res = fn(s, args.nproc, tmp)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            res["wall_s"] = time.perf_counter() - t
            results.append(res)
            rate = res["samples_per_s"]
            console.print(f"  [{len(plain) + len(st) + len(off)}/{total}] {name:<11} "
                          f"{'-' if rate is None else f'{rate:,.1f}'} samples/s  ({res['wall_s']:.1f} s)")
    if any(r["samples_per_s"] is None for r in plain + st + off):
        console.print("[red]no steady-state steps to measure: raise --synthetic-samples or lower --batch-size[/red]")
        return 1

    table = Table(title="steady-state training throughput (samples/s, all ranks); scaletrain with profile on / off")
    for col in ("repeat", "plain DDP", "profile on", "profile off", "on / plain", "on / off", "losses"):
        table.add_column(col, justify="right")
    for i, (p, q, o) in enumerate(zip(plain, st, off)):
        table.add_row(str(i + 1), f"{p['samples_per_s']:,.1f}", f"{q['samples_per_s']:,.1f}",
                      f"{o['samples_per_s']:,.1f}", f"{q['samples_per_s'] / p['samples_per_s']:.3f}",
                      f"{q['samples_per_s'] / o['samples_per_s']:.3f}",
                      " / ".join(sorted({loss_check(p, q), loss_check(p, o)})))
    med_plain = statistics.median(p["samples_per_s"] for p in plain)
    med_st = statistics.median(q["samples_per_s"] for q in st)
    med_off = statistics.median(o["samples_per_s"] for o in off)
    ratio, prof_ratio = med_st / med_plain, med_st / med_off
    pair_ratio = statistics.median(q["samples_per_s"] / p["samples_per_s"] for p, q in zip(plain, st))
    pair_prof = statistics.median(q["samples_per_s"] / o["samples_per_s"] for q, o in zip(st, off))
    table.add_section()
    table.add_row("median", f"{med_plain:,.1f}", f"{med_st:,.1f}", f"{med_off:,.1f}",
                  f"[bold]{ratio:.3f}[/bold]", f"[bold]{prof_ratio:.3f}[/bold]", "")
    console.print(table)
    met = ratio >= TARGET
    verdict = "[green]target met[/green]" if met else "[red]target NOT met[/red]"
    console.print(f"scaletrain / plain = {ratio:.3f} ({100 * (ratio - 1):+.1f}%): {verdict} "
                  f"(scaletrain within {100 * (1 - TARGET):.0f}% of the plain loop)")
    prof_met = prof_ratio >= PROFILER_TARGET
    verdict = "[green]target met[/green]" if prof_met else "[red]target NOT met[/red]"
    console.print(f"profile on / off = {prof_ratio:.3f} ({100 * (prof_ratio - 1):+.1f}%): {verdict} "
                  f"(the profiler costs under {100 * (1 - PROFILER_TARGET):.0f}%); "
                  f"median of the per-repeat ratios {pair_prof:.3f}")
    wall = time.perf_counter() - t0
    spread = max(_spread(plain), _spread(st), _spread(off))
    noisy = " [yellow](over 15%: the machine was busy, the figures are unreliable; rerun)[/yellow]" \
        if spread > NOISY_SPREAD else ""
    console.print(f"median of the per-repeat ratios {pair_ratio:.3f}; run-to-run spread {100 * spread:.0f}%{noisy}")
    console.print(f"benchmark wall time {wall:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "settings": {**s, "nproc": args.nproc, "repeats": args.repeats, "precision": "fp32"},
            "plain": plain, "scaletrain": st, "profile_off": off, "median_plain": med_plain,
            "median_scaletrain": med_st, "median_profile_off": med_off,
            "ratio": ratio, "median_pair_ratio": pair_ratio, "target_ratio": TARGET, "target_met": met,
            "profiler_ratio": prof_ratio, "median_pair_profiler_ratio": pair_prof,
            "profiler_target_ratio": PROFILER_TARGET, "profiler_target_met": prof_met,
            "cpu_busy_at_start": busy, "wall_time_s": wall,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
