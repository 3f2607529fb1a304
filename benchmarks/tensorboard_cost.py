"""What TensorBoard costs a training step: the scalar sink alone (in process), and a short-step run end to end,
with TensorBoard off, writing every step (`--tensorboard-every 1`, the old behaviour) and at the default window
(`--tensorboard-every 10`), side by side in one run.

In process: the sink's wall and process CPU time per step record (a dozen scalars a point), every=1 against the
default, in alternating rounds. End to end: the MLP on digits, 2 ranks of one thread on 2 cores, batch 64 (a
12-ms step, where a fixed cost per step shows), the sides run in a rotating order so that the machine's drift
hits each alike; reported per side: median samples/s with min-max, the ratio of medians to `off` with the range of
the rounds' paired ratios, and the `other` phase (where the sinks run) in ms. A measurement, not a test: exits 0
whatever the figures (1 if a run fails).

    .venv/bin/python benchmarks/tensorboard_cost.py            # `make bench`, ~2.5 min
    .venv/bin/python benchmarks/tensorboard_cost.py --repeats 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

RUN = ["--model", "mlp", "--dataset", "digits", "--nproc", "2", "--threads", "1", "--batch-size", "64",
       "--epochs", "12", "--eval-every", "12", "--optimizer", "sgd", "--no-progress"]
SIDES = {"off": ["--tensorboard", "off"], "every 1": ["--tensorboard", "on", "--tensorboard-every", "1"],
         "every 10": ["--tensorboard", "on", "--tensorboard-every", "10"]}
RECORD = {"loss": 1.0, "lr": 0.1, "step_time_s": 0.012, "samples_per_s": 10000.0, "overlap_ratio": 0.3,
          "bytes_sent": 2_600_000, "epoch": 0, "epoch_steps": 10**9,
          "phases_s": {k: 0.001 for k in ("data_wait", "h2d", "forward", "backward", "comm_exposed", "optimizer",
                                          "other")}}

console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


def sink_cost(every: int, steps: int) -> tuple[float, float]:
    """(wall, process CPU) seconds per step record of a ScalarSink writing one point per `every` steps."""
    from scaletrain.export.tensorboard import ScalarSink

    with tempfile.TemporaryDirectory() as tmp:
        sink = ScalarSink(Path(tmp), 0, every)
        for step in range(20):  # the writer's thread started, its first protos built
            sink({**RECORD, "step": step, "step_in_epoch": step})
        t0, c0 = time.perf_counter(), time.process_time()
        for step in range(20, 20 + steps):
            sink({**RECORD, "step": step, "step_in_epoch": step})
        t1, c1 = time.perf_counter(), time.process_time()
        sink.close()
    return (t1 - t0) / steps, (c1 - c0) / steps


def run(side: str, tmp: Path) -> dict:
    out = tmp / side.replace(" ", "-")
    cmd = [sys.executable, "-m", "scaletrain", "train", *RUN, *SIDES[side], "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        console.print(f"[red]{side} failed (exit {proc.returncode}):[/red] {' '.join(cmd)}\n{proc.stderr[-2000:]}")
        sys.exit(1)
    summary = json.loads((out / "summary.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return {"samples_per_s": summary["samples_per_s"], "other_s": summary["phases_mean_s"]["other"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="rounds of each side, interleaved (default: %(default)s)")
    ap.add_argument("--json", metavar="PATH", help="write the results to this JSON file")
    args = ap.parse_args(argv)

    cost = {1: [], 10: []}
    for _ in range(max(3, args.repeats)):
        for every in (1, 10):
            cost[every].append(sink_cost(every, 500))
    table = Table(title="the scalar sink alone, per step record (medians of alternating rounds)")
    for col in ("every", "wall", "process CPU", "rounds' wall"):
        table.add_column(col, justify="right")
    for every, rows in cost.items():
        walls = [w for w, _ in rows]
        table.add_row(str(every), f"{statistics.median(walls) * 1e6:.0f} us",
                      f"{statistics.median(c for _, c in rows) * 1e6:.0f} us",
                      f"{min(walls) * 1e6:.0f}-{max(walls) * 1e6:.0f} us")
    console.print(table)

    results: dict[str, list[dict]] = {s: [] for s in SIDES}
    names = list(SIDES)
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            order = names[k % len(names):] + names[:k % len(names)]
            for side in order:
                results[side].append(run(side, Path(tmp)))
                print(f"round {k + 1}/{args.repeats}: {side} {results[side][-1]['samples_per_s']:.0f} samples/s",
                      flush=True)
    base = statistics.median(r["samples_per_s"] for r in results["off"])
    table = Table(title="MLP, digits, 2 ranks of one thread, batch 64: end to end")
    for col in ("TensorBoard", "samples/s (min-max)", "/ off", "rounds' ratios", "other"):
        table.add_column(col, justify="right")
    for side, rows in results.items():
        rates = [r["samples_per_s"] for r in rows]
        paired = [r["samples_per_s"] / o["samples_per_s"] for r, o in zip(rows, results["off"])]
        table.add_row(side, f"{statistics.median(rates):.0f} ({min(rates):.0f}-{max(rates):.0f})",
                      f"{statistics.median(rates) / base:.3f}", f"{min(paired):.3f}-{max(paired):.3f}",
                      f"{statistics.median(r['other_s'] for r in rows) * 1e3:.2f} ms")
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"sink": {str(k): v for k, v in cost.items()}, "runs": results},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
