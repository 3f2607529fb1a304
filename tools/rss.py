"""Resident memory of a command's processes: runs COMMAND, samples the resident set size (/proc/PID/status,
VmRSS) of every process it starts every 0.1 s, and prints per process its median, last and largest sample
and its high-water mark (VmHWM), in MiB. Linux only.

    python tools/rss.py scaletrain train --strategy pipeline --nproc 2 ...

Used for docs/strategies.md's figures of what a pipeline rank holds. Processes under --min-mib (default
200: the launcher's helpers) are left out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _parents() -> dict[int, int]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass  # gone meanwhile
    return out


def descendants(root: int) -> set[int]:
    parents, found, todo = _parents(), set(), [root]
    while todo:
        pid = todo.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found.add(child)
                todo.append(child)
    return found


def memory_mib(pid: int) -> tuple[float, float] | None:
    """(VmRSS, VmHWM) in MiB, or None for a process that is gone or has no memory of its own."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
    except (OSError, KeyError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-mib", type=float, default=200.0)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if not args.command:
        ap.error("give the command to run")
    proc = subprocess.Popen(args.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples: dict[int, list[float]] = {}
    hwm: dict[int, float] = {}
    names: dict[int, str] = {}
    while proc.poll() is None:
        for pid in descendants(proc.pid):
            mem = memory_mib(pid)
            if mem is None:
                continue
            samples.setdefault(pid, []).append(mem[0])
            hwm[pid] = max(hwm.get(pid, 0.0), mem[1])
            if pid not in names:
                try:
                    names[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:70]
                except OSError:
                    names[pid] = "?"
        time.sleep(0.1)
    print(f"exit {proc.returncode}")
    for pid, rss in sorted(samples.items()):
        if max(rss) >= args.min_mib:
            print(f"pid {pid}: median {statistics.median(rss):.0f}, last {rss[-1]:.0f}, largest {max(rss):.0f}, "
                  f"VmHWM {hwm[pid]:.0f} MiB ({len(rss)} samples)  {names[pid]}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
