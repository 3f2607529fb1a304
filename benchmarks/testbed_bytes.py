"""Bytes on the wire per rank, from the testbed interfaces' counters (root only; issue 4, measurement 1).

For P = 2, 3, 4 hosts on 1 Gbit links, one rank per host, trains an MLP (N parameters) with `ring`
(P workers) and `ps-sync` (1 server, the last host, and P-1 workers), and prints each host's bytes per
step next to the theory: 2N(P-1)/P per rank for the ring, N(P-1) sent and N(P-1) received, 2N(P-1)
in all, for the server. Usage: .venv/bin/python benchmarks/testbed_bytes.py [--hosts 2,3,4]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

TRAIN = ["--model", "mlp", "--dataset", "synthetic", "--image-size", "32", "--synthetic-samples", "768",
         "--batch-size", "32", "--epochs", "1", "--no-progress", "--nproc", "1", "--threads", "1"]


def run(hosts: int, strategy: str, out: Path, rate: str) -> tuple[dict, dict]:
    cmd = [sys.executable, "-m", "scaletrain", "testbed", "run", "--hosts", str(hosts), "--rate", rate, "--",
           sys.executable, "-m", "scaletrain", "train", *TRAIN, "--strategy", strategy, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{strategy} on {hosts} hosts failed:\n{proc.stderr[-2000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("bytes sent on the testbed links"))
    sent = {h: int(n.replace(",", "")) for h, n in re.findall(r"(st-h\d+) ([\d,]+)", line)}
    return sent, json.loads((out / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hosts", default="2,3,4")
    ap.add_argument("--rate", default="1gbit")
    args = ap.parse_args()
    print(f"{'strategy':9} {'P':>2} {'steps':>5} {'host':6} {'bytes sent':>14} {'per step':>12} "
          f"{'theory/step':>12} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for p in [int(x) for x in args.hosts.split(",")]:
            for strategy in ("ring", "ps-sync"):
                sent, s = run(p, strategy, Path(tmp) / f"{strategy}-{p}", args.rate)
                n_bytes, steps = 4 * 1_707_274, s["steps"]
                for i, (host, total) in enumerate(sorted(sent.items())):
                    if strategy == "ring":
                        theory, role = 2 * n_bytes * (p - 1) / p, "rank"
                    elif i == p - 1:  # (the server also sends the initial parameters once: steps + 1 sends)
                        theory, role = n_bytes * (p - 1), "server"
                    else:
                        theory, role = n_bytes, "worker"
                    once = theory if role == "server" else 0
                    print(f"{strategy:9} {p:>2} {steps:>5} {host:6} {total:>14,} {total / steps:>12,.0f} "
                          f"{theory:>12,.0f} {total / steps / theory:>6.3f}  {role}"
                          + (f", {total / (theory * steps + once):.4f} of (steps + 1) sends" if once else ""))
                if strategy == "ps-sync":
                    server = sent[f"st-h{p - 1}"]
                    received = sum(v for h, v in sent.items() if h != f"st-h{p - 1}")
                    print(f"{'':9} {p:>2} server sent + received {server + received:,} = "
                          f"{(server + received) / steps:,.0f} per step; 2N(P-1) = {2 * n_bytes * (p - 1):,} "
                          f"(ratio {(server + received) / steps / (2 * n_bytes * (p - 1)):.3f})", flush=True)


if __name__ == "__main__":
    main()
