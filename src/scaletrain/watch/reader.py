"""A run directory read again and again while its run writes it: each refresh reads only what is new.

Kept between refreshes: every step of the primary rank as a few numbers (progress and the mean
throughput need them all) and each rank's last `window` step records (the phases, stragglers and
diagnosis are computed over those). The analysis is redone only when new steps have arrived.
"""

from __future__ import annotations

import json
import time
import tomllib
from collections import deque
from pathlib import Path
from typing import Any

from scaletrain.analysis import RANK_FILE
from scaletrain.config.io import train_table
from scaletrain.errors import UserError
from scaletrain.rundir import RunDir
from scaletrain.train.restarts import path_of, restarts
from scaletrain.watch.state import POSITIONS, Observed, Snapshot, Step, analyze, heap_settled, snapshot
from scaletrain.watch.tail import JsonlTail

DEFAULT_WINDOW = 2000
LINE_BYTES = 2048  # generous bytes per step record: where a long file of another rank is first read from
DROPPED = ("comm_intervals_s", "spans_s")  # per-bucket and per-span detail the analysis does not use


def open_run(path: str | Path) -> RunDir:
    """The run directory at `path`, or one line saying why it is not one."""
    run = RunDir(Path(path))
    if not run.root.exists():
        raise UserError(f"{path} does not exist: give the run directory of a run (its --out)")
    if not run.root.is_dir():
        raise UserError(f"{path} is a file, not a run directory: give the run's --out folder")
    if not run.config.is_file() and not _rank_files(run):
        raise UserError(f"{path} is not a scaletrain run directory (no config.toml, no metrics-rank*.jsonl): "
                        "give the --out of a run")
    return run


def _rank_files(run: RunDir) -> dict[int, Path]:
    try:
        return {int(m.group(1)): f for f in run.root.iterdir() if (m := RANK_FILE.fullmatch(f.name))}
    except OSError:
        return {}


class RunReader:
    """`snapshot()` of the run as it is now, reading only the bytes written since the last call."""

    def __init__(self, run: RunDir, window: int = DEFAULT_WINDOW) -> None:
        self.run, self.window = run, window
        self._tails: dict[int, JsonlTail] = {}
        self._recent: dict[int, deque] = {}
        self._counts: dict[int, int] = {}
        self._primary: int | None = None
        self._steps: list[Step] = []
        self._longest_pause, self._longest_epoch = 0.0, 0
        self._sums = [[0, 0.0] for _ in range(POSITIONS)]
        self._epochs_tail, self._epochs = JsonlTail(run.epochs), []
        self._files: dict[Path, tuple[float, Any]] = {}  # path -> (mtime, parsed) for config and summary
        self._version = self._analysed = self._settled_version = 0
        self._analysis: dict[str, Any] | None = None
        self._settled: int | None = None

    def snapshot(self, now: float | None = None, stale_s: float | None = None) -> Snapshot:
        obs = self.observe()
        if self._analysed != self._version:
            self._analysis, self._analysed = analyze(obs), self._version
        return snapshot(obs, self._analysis, time.time() if now is None else now, stale_s)

    def observe(self) -> Observed:
        notes: list[str] = []
        config = self._parsed(self.run.config, _toml, notes) or {}
        summary = self._parsed(self.run.summary, _json, notes)
        restart_lines = self._parsed(path_of(self.run), _jsonl, notes) or []
        self._read_metrics()
        new_epochs, restarted = self._epochs_tail.read()
        self._epochs = new_epochs if restarted else self._epochs + new_epochs
        ended = summary is not None
        for rank, tail in sorted(self._tails.items()):
            if tail.damaged:
                notes.append(f"metrics-rank{rank}.jsonl: {tail.damaged} damaged line(s) left out")
            if ended and tail.partial:
                notes.append(f"metrics-rank{rank}.jsonl: the last line was cut off (the rank was killed "
                             "mid-write) and is left out")
        notes += _errors(self.run.root / "errors")
        if not ended and self.run.preempt.exists():
            notes.append("preemption requested (RUN/preempt exists): the run checkpoints within 10 steps and ends")
        if ended:
            notes += [str(n) for n in summary.get("notes") or []]
        writes = [t.mtime for t in self._tails.values() if t.mtime is not None]
        windows = {rank: list(recs) for rank, recs in self._recent.items()}
        window_full = bool(self.window) and any(c > self.window for c in self._counts.values())
        if self._settled_version != self._version:  # a whole pass over the steps: only when new ones came
            self._settled, self._settled_version = heap_settled(self._steps, windows, window_full), self._version
        return Observed(
            root=str(self.run.root), config=config, summary=summary,
            summary_mtime=self._files.get(self.run.summary, (None,))[0] if summary is not None else None,
            last_write=max(writes) if writes else None, launched=self._files.get(self.run.config, (None,))[0],
            primary=self._primary, steps=self._steps,
            windows=windows, window=self.window, window_full=window_full, settled=self._settled,
            epochs=self._epochs, sums_by_position=[list(x) for x in self._sums],
            longest_epoch=self._longest_epoch, longest_pause_s=self._longest_pause,
            restarts=len(restarts(restart_lines)) if restart_lines else None, notes=notes)

    def _read_metrics(self) -> None:
        files = _rank_files(self.run)
        if files and (self._primary is None or min(files) < self._primary):
            self._primary = min(files)  # read whole; the other ranks only for their recent steps
            self._tails.pop(self._primary, None)
            self._reset(self._primary)
        for rank, path in files.items():
            if rank not in self._tails:
                far = None if rank == self._primary or not self.window else self.window * LINE_BYTES
                self._tails[rank] = JsonlTail(path, skip_to=far)
                self._reset(rank)
            tail = self._tails[rank]
            while True:
                records, restarted = tail.read()
                if restarted:  # replaced (a resume dropped the part it redoes) or cut: read again from the start
                    self._reset(rank)
                if records:
                    self._add(rank, records)
                if not tail.behind:
                    break

    def _add(self, rank: int, records: list[dict[str, Any]]) -> None:
        self._version += 1
        self._counts[rank] += len(records)
        kept = records[-self.window:] if self.window else records
        self._recent[rank].extend({k: v for k, v in r.items() if k not in DROPPED} for r in kept)
        if rank == self._primary:
            self._add_steps([_step(r) for r in records if "step_time_s" in r])

    def _add_steps(self, steps: list[Step]) -> None:
        """Keep them; add them to the sums behind the mean throughput (so that it costs nothing per refresh
        in a long run); the longest pause between two steps (an evaluation, a checkpoint, a restart)."""
        for s in steps:
            sums = self._sums[min(s.step_in_epoch, POSITIONS - 1)]
            sums[0] += s.samples
            sums[1] += s.step_time_s
            self._longest_epoch = max(self._longest_epoch, s.step_in_epoch + 1)
            before = self._steps[-1] if self._steps else None
            if before is not None and s.t_start_s is not None and before.t_start_s is not None:
                pause = s.t_start_s - before.t_start_s - before.step_time_s
                self._longest_pause = max(self._longest_pause, pause)
            self._steps.append(s)

    def _reset(self, rank: int) -> None:
        self._recent[rank] = deque(maxlen=self.window or None)
        self._counts[rank] = 0
        self._version += 1
        if rank == self._primary:
            self._steps, self._longest_pause, self._longest_epoch = [], 0.0, 0
            self._sums = [[0, 0.0] for _ in range(POSITIONS)]

    def _parsed(self, path: Path, parse, notes: list[str]) -> Any:
        """The file parsed, again only when its modification time changed; None while it does not exist."""
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            self._files.pop(path, None)
            return None
        if path in self._files and self._files[path][0] == mtime:
            return self._files[path][1]
        try:
            value = parse(path.read_text())
        except (OSError, ValueError) as e:
            notes.append(f"{path.name} could not be read ({e}); shown without it")
            return None
        if path == self.run.summary:
            self._version += 1  # where the run sat (device, cores) feeds the analysis
        self._files[path] = (mtime, value)
        return value


def _step(r: dict[str, Any]) -> Step:
    return Step(step=int(r.get("step", 0)), epoch=int(r.get("epoch", 0)), step_in_epoch=int(r.get("step_in_epoch", 0)),
                samples=int(r.get("samples", 0)), step_time_s=float(r["step_time_s"]),
                samples_per_s=r.get("samples_per_s"), t_start_s=r.get("t_start_s"), epoch_steps=r.get("epoch_steps"),
                fresh_pages=r.get("fresh_pages"))


def _toml(text: str) -> dict[str, Any]:
    return train_table(tomllib.loads(text))


def _json(text: str) -> Any:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _jsonl(text: str) -> list[dict[str, Any]]:
    """Complete JSON lines; a line being written (or cut off) is left out."""
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _errors(folder: Path) -> list[str]:
    """`rank 1 failed: ValueError: ... (errors/rank1.txt)` for each traceback a failed rank left."""
    notes = []
    for path in sorted(folder.glob("rank*.txt")) if folder.is_dir() else []:
        try:
            lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            continue
        last = lines[-1] if lines else "(empty traceback)"
        notes.append(f"{path.stem.replace('rank', 'rank ')} failed: {last} (errors/{path.name})")
    return notes
