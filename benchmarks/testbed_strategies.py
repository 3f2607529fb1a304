"""Samples/s of every strategy on the testbed, side by side in one run (root only; issue 4, measurement 3).

ResNet-20 on digits, 2 workers of one rank each, links shaped to --rate (default 100mbit): allreduce,
ring and allreduce + topk:0.01 on 2 hosts; ps-sync and ps-async on 3 hosts (the third is the server).
Usage: .venv/bin/python benchmarks/testbed_strategies.py [--rate 100mbit] [--epochs 2]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = [("allreduce", 2, []), ("ring", 2, ["--strategy", "ring"]),
         ("allreduce+topk:0.01", 2, ["--compress", "topk:0.01"]),
         ("ps-sync", 3, ["--strategy", "ps-sync"]), ("ps-async", 3, ["--strategy", "ps-async", "--lr", "0.01"])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--epochs", default="2")
    args = ap.parse_args()
    train = ["--model", "resnet20", "--dataset", "digits", "--batch-size", "32", "--epochs", args.epochs,
             "--no-progress", "--nproc", "1", "--threads", "1"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, hosts, extra in CASES:
            out = Path(tmp) / re.sub(r"\W", "_", name)
            cmd = [sys.executable, "-m", "scaletrain", "testbed", "run", "--hosts", str(hosts), "--rate", args.rate,
                   "--", sys.executable, "-m", "scaletrain", "train", *train, *extra, "--out", str(out)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"{name} failed:\n{proc.stderr[-2000:]}")
            s = json.loads((out / "summary.json").read_text())
            line = next(x for x in proc.stdout.splitlines() if x.startswith("bytes sent on the testbed links"))
            counters = [int(n.replace(",", "")) for n in re.findall(r"st-h\d+ ([\d,]+)", line)]
            phases, step = s["phases_mean_s"], s["step_time_mean_s"]
            rows.append((name, hosts, s["samples_per_s"], phases["comm_exposed"] * 1e3, phases["comm_exposed"] / step,
                         s["bytes_sent_per_step"], s["top1"], counters))
            print(f"done: {name}", flush=True)
    print(f"\n{'strategy':22} {'hosts':>5} {'samples/s':>10} {'exposed comm':>13} {'share':>6} "
          f"{'bytes/step/worker':>18} {'top1':>6}  interface counters (bytes sent per host)")
    base = rows[0][2]
    for name, hosts, sps, exposed, share, sent, top1, counters in rows:
        print(f"{name:22} {hosts:>5} {sps:>10.1f} {exposed:>10.1f} ms {share:>6.0%} {sent:>18,.0f} {top1:>6.3f}  "
              f"{', '.join(f'{c:,}' for c in counters)}   ({sps / base:.2f}x allreduce)")


if __name__ == "__main__":
    main()
