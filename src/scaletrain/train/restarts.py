"""RUN/restarts.jsonl: each time the elastic agent restarted the workers, and how they came back.

Two kinds of lines (docs/run-directory.md), appended as they happen:

    {"event": "failure", "attempt": n, "time": T, "node": k, "rank": r, "cause": "...", "reached_step": s}
        written by node k's launcher when its agent is about to start attempt n+1 of the workers;
        reached_step: steps finished before the failure (the last one on record in metrics-rank*.jsonl)
    {"event": "resumed", "attempt": n, "time": T, "step": s}
        written by rank 0 of attempt n when its first step has ended: it went on from step s (the
        latest checkpoint's), so the steps from s to reached_step were trained twice

`restarts(run)` pairs them into summary.json's `restarts` list.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from scaletrain.rundir import RunDir, append_jsonl


def path_of(run: RunDir) -> Path:
    return run.root / "restarts.jsonl"


def append(run: RunDir, record: dict[str, Any]) -> None:
    """One line, in one write call (lines from several nodes' launchers do not interleave)."""
    append_jsonl(path_of(run), record)


def reached_step(run: RunDir) -> int | None:
    """Steps finished on record: one more than the highest step of any rank's metrics file (their last
    lines; every step's line reaches the file as it ends)."""
    best = None
    for path in run.root.glob("metrics-rank*.jsonl"):
        for line in reversed(_tail(path).splitlines()):
            try:
                step = int(json.loads(line)["step"]) + 1
            except (ValueError, KeyError, TypeError):
                continue  # the line a killed worker cut short
            best = step if best is None else max(best, step)
            break
    return best


def _tail(path: Path, size: int = 1 << 16) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - size))
        return f.read().decode(errors="replace")


class ResumedSink:
    """A sink of the loop on rank 0 of a restarted attempt: the first step's end goes on record."""

    def __init__(self, run: RunDir, attempt: int) -> None:
        self.run, self.attempt, self.done = run, attempt, False

    def epoch_start(self, epoch: int, epochs: int, steps: int, done: int = 0) -> None:
        pass

    def step(self, record: dict[str, Any]) -> None:
        if not self.done:
            self.done = True
            append(self.run, {"event": "resumed", "attempt": self.attempt, "time": time.time(),
                              "step": record["step"]})

    def epoch_end(self, record: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def restarts(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """summary.json's `restarts`: one entry per failure the workers were restarted from, with when, which
    rank and why, the step it had reached, the step the next attempt resumed from, the steps trained
    twice, and the seconds from the failure to the next attempt's first step (recovery_s)."""
    resumed = {r["attempt"]: r for r in lines if r.get("event") == "resumed"}
    out = []
    for f in (r for r in lines if r.get("event") == "failure"):
        back = resumed.get(f["attempt"] + 1)
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(f["time"])), "attempt": f["attempt"],
                 "node": f.get("node", 0), "rank": f.get("rank"), "cause": f.get("cause"),
                 "reached_step": f.get("reached_step"), "resumed_from_step": None, "steps_replayed": None,
                 "recovery_s": None}
        if back is not None:
            first = back["step"]  # the first step trained again
            entry |= {"resumed_from_step": first, "recovery_s": round(back["time"] - f["time"], 3),
                      "steps_replayed": None if f.get("reached_step") is None else max(0, f["reached_step"] - first)}
        out.append(entry)
    return out
