"""What recovery costs: `--checkpoint-every` at a few intervals against none (samples/s side by side), and
the time from a worker's death (`kill -9` from outside) to training resumed.

Checkpoint cost: the same training (model, data, 2 ranks, `--epochs`) at each interval, interleaved in a
rotating order over `--repeats` rounds so that drift of a shared machine hits every side alike;
throughput is training samples / training time of the epochs (checkpoints within an epoch fall inside
it; epoch-end checkpoints, the same for every side, do not), and the summary's `checkpoints` gives the
seconds each checkpoint held the ranks. Recovery: `--kills` launches with `--max-restarts 2`, each with
one worker SIGKILLed part way through; `recovery_s` is summary.json's (the failure noticed by the agent
-> the end of the first step trained again: new workers started, process group, checkpoint loaded, one
step), with the final weights checked against an uninterrupted run's. A measurement, not a test: exits 0
whatever the numbers (1 if a run fails).

    .venv/bin/python benchmarks/recovery.py               # `make bench-recovery` (~6 min here)
    .venv/bin/python benchmarks/recovery.py --model vgg11 --intervals 0,50,10 --kills 0
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from scaletrain.distributed.env import child_env

ROOT = Path(__file__).resolve().parents[1]
console = Console(highlight=False)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet20", help="(default: %(default)s)")
    ap.add_argument("--dataset", default="digits", help="(default: %(default)s)")
    ap.add_argument("--epochs", type=int, default=2, help="(default: %(default)s)")
    ap.add_argument("--batch-size", type=int, default=32, help="per rank (default: %(default)s)")
    ap.add_argument("--intervals", default="0,20,5,1", help="--checkpoint-every values; 0: epoch ends only "
                                                           "(default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of the intervals, interleaved (default: %(default)s)")
    ap.add_argument("--kills", type=int, default=5, help="launches with one worker killed (default: %(default)s)")
    ap.add_argument("--json", metavar="PATH", help="write the results to this JSON file")
    args = ap.parse_args(argv)
    args.intervals = [int(v) for v in args.intervals.split(",")]
    if min(args.epochs, args.batch_size, args.repeats) < 1 or args.kills < 0 or min(args.intervals) < 0:
        ap.error("--epochs, --batch-size and --repeats must be at least 1; --kills and intervals not negative")
    return args


def train_argv(args, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "scaletrain", "train", "--model", args.model, "--dataset", args.dataset,
            "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--nproc", "2", "--no-progress",
            "--tensorboard", "off", "--out", str(out), *extra]


def run(argv: list[str]) -> dict:
    proc = subprocess.run(argv, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[3:])} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return json.loads((Path(argv[argv.index("--out") + 1]) / "summary.json").read_text())


def checkpoint_cost(args, work: Path) -> dict[int, list[dict]]:
    results: dict[int, list[dict]] = {k: [] for k in args.intervals}
    order = list(args.intervals)
    with console.status("") as status:
        for r in range(args.repeats):
            for k in order:
                status.update(f"round {r + 1}/{args.repeats}: --checkpoint-every {k}")
                s = run(train_argv(args, work / f"every{k}-{r}", "--checkpoint-every", str(k)))
                results[k].append({"samples_per_s": s["steps"] * 2 * args.batch_size / sum(s["epoch_times_s"]),
                                   "checkpoints": s["checkpoints"], "digest": s["param_digests"][0]})
            order = order[1:] + order[:1]  # rotate: every interval meets every position
    return results


def workers_of(launcher: int) -> dict[int, int]:
    """rank -> PID of the workers `launcher` started (their heartbeat files hold their PIDs)."""
    out = {}
    for beat in Path(tempfile.gettempdir()).glob("scaletrain-err-*/alive-rank*"):
        try:
            pid = int(beat.read_text())
            if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == launcher:
                out[int(beat.name.removeprefix("alive-rank"))] = pid
        except (OSError, ValueError, IndexError):
            continue
    return out


def recovery(args, work: Path, want: str) -> list[dict]:
    out = []
    for i in range(args.kills):
        run_dir = work / f"kill{i}"
        argv = train_argv(args, run_dir, "--checkpoint-every", "10", "--max-restarts", "2")
        proc = subprocess.Popen(argv, cwd=ROOT, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        at = 5 + (8 * i) % 36  # within the 44 steps of the default run, in both epochs
        killed = False
        deadline = time.monotonic() + 600
        metrics = run_dir / "metrics-rank0.jsonl"
        while proc.poll() is None and time.monotonic() < deadline and not killed:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= at:
                pid = workers_of(proc.pid).get(i % 2)
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    killed = True
            time.sleep(0.005)
        try:
            _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise RuntimeError(f"kill {i}: no end within 600 s")
        if proc.returncode != 0 or not killed:
            raise RuntimeError(f"kill {i}: exit {proc.returncode}, killed={killed}: {err.strip()[-500:]}")
        s = json.loads((run_dir / "summary.json").read_text())
        [r] = s["restarts"]
        out.append(r | {"weights_equal": s["param_digests"][0] == want, "step_time_s": s.get("step_time_mean_s")})
    return out


def spread(values: list[float]) -> str:
    mid = statistics.median(values)
    return f"{(max(values) - min(values)) / mid:.0%}" if mid else "-"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="scaletrain-bench-recovery-") as tmp:
        work = Path(tmp)
        try:
            cost = checkpoint_cost(args, work)
            want = cost[args.intervals[0]][0]["digest"]
            kills = recovery(args, work, want) if args.kills else []
        except RuntimeError as e:
            console.print(f"[red]error:[/] {e}")
            return 1
    base = statistics.median(r["samples_per_s"] for r in cost[args.intervals[0]])
    table = Table(caption="every: --checkpoint-every steps; samples/s: median; per ckpt: mean seconds a checkpoint "
                          "held the ranks; same weights: as the first interval's run",
                  title=f"--checkpoint-every: {args.model} on {args.dataset}, 2 ranks, batch {args.batch_size}, "
                        f"{args.epochs} epochs, {args.repeats} interleaved rounds")
    for col in ("every", "samples/s", "spread", f"vs {args.intervals[0]}", "ckpts/run", "per ckpt",
                "same weights"):
        table.add_column(col, justify="right")
    rows = []
    for k, results in cost.items():
        rate = statistics.median(r["samples_per_s"] for r in results)
        per = [r["checkpoints"]["total_s"] / max(1, r["checkpoints"]["written"]) for r in results]
        rows.append({"interval": k, "samples_per_s": rate, "spread": spread([r["samples_per_s"] for r in results]),
                     "ratio": rate / base, "checkpoints": results[0]["checkpoints"]["written"],
                     "checkpoint_s_mean": statistics.mean(per),
                     "weights_equal": all(r["digest"] == want for r in results)})
        table.add_row(str(k) if k else "0 (epoch end)", f"{rate:,.0f}", rows[-1]["spread"], f"{rate / base:.3f}",
                      str(rows[-1]["checkpoints"]), f"{statistics.mean(per) * 1000:.1f} ms",
                      "yes" if rows[-1]["weights_equal"] else "NO")
    console.print(table)
    if kills:
        times = [k["recovery_s"] for k in kills]
        console.print(f"recovery after kill -9 of one worker ({len(kills)} launches, --max-restarts 2, "
                      f"--checkpoint-every 10): {len([k for k in kills if k['weights_equal']])}/{len(kills)} ended "
                      f"with the uninterrupted run's weights; seconds from the failure to the first step trained "
                      f"again: median {statistics.median(times):.1f}, min {min(times):.1f}, max {max(times):.1f}; "
                      f"steps trained twice: {', '.join(str(k['steps_replayed']) for k in kills)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "checkpoint_every": rows, "kills": kills}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
