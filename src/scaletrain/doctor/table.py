"""What `scaletrain doctor` shows and writes: node 0's table, the other nodes' one-line verdict, the JSON
document of `--json` (its format: docs/doctor.md)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path

from scaletrain.grid import Grid

from scaletrain.doctor.checks import exit_code, worst
from scaletrain.doctor.gathered import Check, Expect, Gathered
from scaletrain.rundir import write_json_atomic

FORMAT = 1
STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}


def table(g: Gathered, checks: list[Check], seconds: float) -> Grid:
    """The checks, node 0's table (the result in rich markup: its colour)."""
    return Grid(f"scaletrain doctor: {g.nnodes} node{'s' if g.nnodes != 1 else ''}, rendezvous "
                f"{g.master_addr}:{g.master_port}, {seconds:.1f} s", ["check", "host(s)", "result", "measured", "fix"],
                rows=[[c.check, c.hosts, f"[{STYLE[c.status]}]{c.status}[/]", c.value, c.fix or ""] for c in checks],
                text_columns=(0, 1, 2, 3, 4))


def summary_line(checks: list[Check]) -> str:
    """`pass: 10 checks` / `fail: versions, link (2 of 10 checks failed)`: the verdict in one line."""
    names = list(dict.fromkeys(c.check for c in checks))
    failed = list(dict.fromkeys(c.check for c in checks if c.status == "fail"))
    warned = list(dict.fromkeys(c.check for c in checks if c.status == "warn" and c.check not in failed))
    status = worst(checks)
    if status == "fail":
        line = f"fail: {', '.join(failed)} ({len(failed)} of {len(names)} checks failed)"
    else:
        line = f"pass: {len(names)} checks" + (f" ({len(warned)} with a warning: {', '.join(warned)})" if warned else "")
    return line + f"; exit {exit_code(checks)}"


def verdict(checks: list[Check]) -> dict:
    """What node 0 tells the other nodes at the end."""
    return {"code": exit_code(checks), "line": summary_line(checks)}


def node_line(label: str, v: dict) -> str:
    """The other nodes' one line."""
    return f"doctor: {label}: {v['line']} (node 0 prints the table)"


def document(g: Gathered, checks: list[Check], expect: Expect, seconds: float) -> dict:
    counts = Counter(c.status for c in checks)
    return {"format": FORMAT, "status": worst(checks), "exit_code": exit_code(checks), "seconds": round(seconds, 3),
            "counts": {s: counts.get(s, 0) for s in ("pass", "warn", "fail")},
            "expect": asdict(expect), "checks": [asdict(c) for c in checks], "gathered": g.to_dict()}


def write_json(path: str, doc: dict) -> None:
    write_json_atomic(Path(path), doc)
