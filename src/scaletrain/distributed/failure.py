"""A failed rank keeps its cause: one line for the person, each rank's traceback in the run directory.

Worker side: every rank beats a heartbeat file (its PID; the file's mtime is its last sign of life) and,
when it fails, writes its full traceback to RUN/errors/rank{r}.txt and a one-line record for the launcher.
Launcher side: `explain` turns the records, the exit codes the elastic agent saw and the heartbeats into
the one line that names the first cause: a rank killed by a signal, a rank that stopped responding (no
heartbeat while its peers timed out waiting for it), or the first rank that raised.
"""

from __future__ import annotations

import json
import os
import signal
import sysconfig
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

BEAT_S = 1.0
STALE_S = 5.0  # a rank whose heartbeat is older than this has stopped (SIGSTOP, swapping, a native hang)
_LIBRARY = tuple(str(Path(p).resolve()) for p in (Path(torch.__file__).parent, sysconfig.get_paths()["stdlib"]))


# ------------------------------------------------------------------ worker side
class Heartbeat:
    """A daemon thread that touches `folder/alive-rank{r}` every second (cheap: one utime)."""

    def __init__(self, folder: str | Path, rank: int) -> None:
        self.path = Path(folder) / f"alive-rank{rank}"
        self.path.write_text(str(os.getpid()))
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="scaletrain-heartbeat", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                return

    def stop(self) -> None:
        """The rank finished: no more beats, and no file that could name it (or its PID) later."""
        self._stop.set()
        self.path.unlink(missing_ok=True)


def where(tb) -> str | None:
    """`file.py:42 in forward` of the innermost frame outside torch and the standard library: the user's
    model, or scaletrain's own code, rather than the torch function that noticed the problem."""
    frames = [f for f in traceback.extract_tb(tb) if not str(Path(f.filename).resolve()).startswith(_LIBRARY)]
    if not frames:
        return None
    f = frames[-1]
    return f"{f.filename}:{f.lineno} in {f.name}"


def one_line(exc: BaseException) -> str:
    """`RuntimeError: mat1 and mat2 shapes cannot be multiplied (64x10 and 20x5) (at nets.py:12 in forward)`."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = _strip_source_location(lines[0]) if lines else "(no message)"
    at = where(exc.__traceback__)
    return f"{type(exc).__name__}: {text}" + (f" (at {at})" if at else "")


def _strip_source_location(text: str) -> str:
    """gloo and c10d prefix their messages with `[../third_party/gloo/...cc:81] `: keep what follows."""
    if text.startswith("[") and "] " in text and ".cc:" in text.split("] ", 1)[0]:
        return text.split("] ", 1)[1]
    return text


def record_error(err_dir: str | Path, run_root: str | Path | None, rank: int, exc: BaseException,
                 user_error: bool) -> None:
    """The traceback in RUN/errors/rank{r}.txt; the one-line record for the launcher in err_dir."""
    line = str(exc) if user_error else one_line(exc)
    trace_file = None
    if not user_error and run_root is not None:
        try:
            errors = Path(run_root) / "errors"
            errors.mkdir(parents=True, exist_ok=True)
            trace_file = errors / f"rank{rank}.txt"
            trace_file.write_text("".join(traceback.format_exception(exc)))
        except OSError:
            trace_file = None
    record = {"rank": rank, "line": line, "user_error": user_error, "time": time.time(),
              "traceback": str(trace_file) if trace_file else None}
    Path(err_dir, f"rank{rank}.json").write_text(json.dumps(record))


# ------------------------------------------------------------------ launcher side
@dataclass(frozen=True)
class Outcome:
    """What the launcher saw of a failed job, as plain data (so that `explain` is a pure function)."""

    records: list[dict]  # the ranks' one-line records, in the order they were written
    exitcodes: dict[int, int]  # rank -> exit code of the ranks the agent saw fail (negative: signal)
    hung_s: dict[int, float]  # rank -> seconds it had been silent when the watchdog ended it
    timeout_s: float


def read_outcome(err_dir: str | Path, exitcodes: dict[int, int], timeout_s: float) -> Outcome:
    folder = Path(err_dir)
    records = []
    for path in folder.glob("rank*.json"):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    records.sort(key=lambda r: r.get("time", 0))
    hung = {}
    for path in folder.glob("hung-rank*"):
        try:
            hung[int(path.name.removeprefix("hung-rank"))] = float(path.read_text())
        except (OSError, ValueError):
            continue
    return Outcome(records, exitcodes, hung, timeout_s)


def explain(outcome: Outcome, name: Callable[[int], str]) -> tuple[str, bool]:
    """(the one line naming the first cause, whether it was bad input). `name(rank)` says what a rank is
    ("rank 1", "parameter server 0 (rank 2)")."""
    recorded = {r["rank"] for r in outcome.records}
    killed = sorted(r for r, code in outcome.exitcodes.items()
                    if code < 0 and r not in recorded and r not in outcome.hung_s)
    if killed:
        r = killed[0]
        sig = _signal_name(-outcome.exitcodes[r])
        hint = " (out of memory? see `dmesg`)" if sig == "SIGKILL" else ""
        return f"{name(r)} was killed by {sig}{hint}; the other ranks ended with it", False
    # silent for long enough that a peer's --timeout ran out waiting for it (a rank merely slow to exit,
    # or starved for a few seconds on a loaded machine, is not the cause)
    hung = sorted(r for r, s in outcome.hung_s.items() if r not in recorded and s >= 0.5 * outcome.timeout_s)
    if hung:
        who = ", ".join(name(r) for r in hung)
        waited = f" and {name(outcome.records[0]['rank'])} gave up waiting" if outcome.records else ""
        return (f"{who} stopped responding (no sign of life for {outcome.hung_s[hung[0]]:.0f} s){waited} "
                f"after --timeout {outcome.timeout_s:g} s: check that the process is not stopped (SIGSTOP, a "
                "debugger), swapping or hung in native code"), False
    if outcome.records:
        first = outcome.records[0]
        line = f"{name(first['rank'])} failed: {first['line']}"
        if _peer_timeout(first["line"]) and not first.get("user_error"):
            line = (f"{name(first['rank'])} heard nothing from a peer for --timeout {outcome.timeout_s:g} s "
                    f"({first['line']}): a host or its network link went down, or a peer is stuck; "
                    "`scaletrain doctor` checks every host and link")
        if first.get("traceback"):
            line += f" [traceback: {first['traceback']}]"
        return line, bool(first.get("user_error"))
    if outcome.exitcodes:
        r = min(outcome.exitcodes)
        return f"{name(r)} exited with code {outcome.exitcodes[r]} without a message", False
    return "a worker failed without a message", False


def _peer_timeout(line: str) -> bool:
    """gloo's and c10d's words for a peer that sent nothing within the process group's timeout."""
    low = line.lower()
    return "timed out" in low or "timeout" in low and ("recv" in low or "wait" in low)


def set_aside(err_dir: str | Path, attempt: int) -> None:
    """Before the agent restarts the workers: their error records and hang marks become attempt{n}-...,
    so that the next attempt's failure is explained by its own records."""
    folder = Path(err_dir)
    for path in [*folder.glob("rank*.json"), *folder.glob("hung-rank*")]:
        try:
            path.rename(folder / f"attempt{attempt}-{path.name}")
        except OSError:
            continue


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class Watchdog:
    """In the launcher: once a rank has failed, SIGKILL this node's ranks that stopped responding, so
    that the agent's SIGTERM (which a stopped process never handles) does not hold the job for 30 s more."""

    def __init__(self, err_dir: str | Path) -> None:
        self.folder = Path(err_dir)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scaletrain-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            failed = {p.name.removeprefix("rank").removesuffix(".json") for p in self.folder.glob("rank*.json")}
            if not failed:
                continue
            now = time.time()
            for path in self.folder.glob("alive-rank*"):
                rank = path.name.removeprefix("alive-rank")
                try:
                    silent = now - path.stat().st_mtime
                    if rank in failed or silent <= STALE_S:
                        continue  # a rank that reported its own failure is ending by itself
                    os.kill(int(path.read_text()), signal.SIGKILL)  # a worker this launch started
                    Path(self.folder, f"hung-rank{rank}").write_text(f"{silent:.1f}")
                    path.unlink()
                except (OSError, ValueError):
                    continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
