"""The model's own op shapes, timed on the machine a calibration was made on (`predict --time-ops`, docs/predict.md).

A calibration times a grid of shapes and prices any other shape by its law (regress.py), whose cross-validated error
is 15-29% per op here, and whose error on one model's few distinct shapes does not average out: the law put
ResNet-20's convolutions' backward 22% above their own timings (2026-11-27). On the calibration's own machine a
prediction times the shapes of its points that the grid lacks, as calibrate times its grid (predict/timing.time_op,
the allocator settled), within a budget of seconds, largest first; each is scaled to the calibration's speed by the
speed probe (a shape timed while the machine runs 10% slower is taken down by that) and kept in the cache beside
this machine's calibration, so the next prediction reads it. The reference networks' shapes are in the grid for the
same reason: the loop's factors are fitted over timed shapes, and apply to timed shapes."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable

import torch

BUDGET_S = 30.0
"""Seconds one prediction may spend timing shapes (the first time; the cache keeps them)."""
LARGEST_BYTES = 512 * 2 ** 20
"""A shape whose input and output take more is left to its law (the grid's largest are far below)."""
REPEATS = 5
"""Timed batches per shape: as many as `calibrate` times each shape of its grid with. With 3, three timings of the
held-out grid's 76 shapes put the predicted batch-64-over-32 ratio of ResNet-20 up to 14 points apart and LeNet-5's
up to 9.5; with 5, two timings put them 3 and 0.1 points apart (2026-11-29)."""
CALLS = 16
"""About how many calls of each direction timing one shape takes (time_op: warm-up and REPEATS timed batches)."""
MODES = ("auto", "off")


class OpShapes:
    """Times the shapes `LayerTimes` would price by regression, on this machine, and keeps them."""

    def __init__(self, cal: dict[str, Any], cache: Path | None, budget_s: float = BUDGET_S) -> None:
        self.cal, self.cache, self.left, self.budget_s = cal, cache, budget_s, budget_s
        self.rows: list[dict[str, Any]] = _read(cache)
        self.timed = 0  # shapes timed by this prediction
        self.over_budget = 0  # shapes left to their law: out of budget, or too large
        self.tell: Callable[[int], None] = lambda n: None  # told after each shape timed
        self._ratios: dict[int, float] = {}
        self.unsteady: set[int] = set()  # thread counts whose probes moved while calibrated: left to the laws

    def known(self, precision: str, threads: int) -> list[dict[str, Any]]:
        """The timed rows of one (precision, threads), as calibration layer rows."""
        return [r for r in self.rows if r["precision"] == precision and r["threads"] == threads]

    def time_missing(self, lt, ops: list, precision: str, threads: int) -> None:
        """Time the shapes of `ops` that `lt` (the calibration's LayerTimes at `precision` and the calibrated
        `threads`) holds no row of, largest first, while the budget lasts; each joins `lt` and the cache."""
        from scaletrain.predict.datasheet import op_elements
        from scaletrain.predict.regress import _key

        from scaletrain.predict.calibration import unsteady

        if unsteady(self.cal, threads):  # the grid's rows at this thread count ran at speeds the probe cannot undo
            self.unsteady.add(threads)
            return
        todo, seen = [], set()
        for op in ops:
            key = (op.kind, _key(op.features))
            if op.kind == "view" or op.backward_only or key in lt.exact or key in seen or not lt.has(op.kind):
                continue
            seen.add(key)
            fwd, bwd, _ = lt.times(op.kind, op.features)
            todo.append((fwd + bwd, op))
        for law_s, op in sorted(todo, key=lambda t: -t[0]):
            if law_s * CALLS > self.left or 4 * sum(op_elements(op)) > LARGEST_BYTES:
                self.over_budget += 1
                continue
            started = time.perf_counter()
            row = self._timed_row(op.kind, op.features, precision, threads)
            self.left -= time.perf_counter() - started
            lt.add(row)
            self.rows.append(row)
            self.timed += 1
            self.tell(self.timed)

    def save(self) -> None:
        if self.cache is None or not self.timed:
            return
        try:
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.cache.with_suffix(".tmp")
            tmp.write_text(json.dumps({"calibration": identity(self.cal), "rows": self.rows}))
            tmp.replace(self.cache)
        except OSError:
            pass  # a cache that cannot be written: the next prediction times them again

    def note(self) -> str | None:
        if not self.timed and not self.over_budget and not self.unsteady:
            return None
        timed = f"{self.timed} op shape(s) the calibration's grid lacks timed here now" if self.timed else ""
        left = (f"{self.over_budget} priced by their laws (over the {self.budget_s:.0f} s budget or too large to "
                "time: --time-ops SECONDS times more)" if self.over_budget else "")
        shaky = (f"the shapes at {', '.join(map(str, sorted(self.unsteady)))} thread(s) priced by their laws (the "
                 "machine's speed moved while those were calibrated)" if self.unsteady else "")
        return "; ".join(p for p in (timed, left, shaky) if p) + " (predict/shapes.py; --time-ops off: laws only)"

    def _timed_row(self, kind: str, f: dict[str, int], precision: str, threads: int) -> dict[str, Any]:
        from scaletrain.distributed.allocator import settle
        from scaletrain.predict.timing import time_grid_op

        settle("steady")  # as calibrate times its grid: the heap keeps what each op frees
        device = _device(self.cal)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            fwd, bwd = time_grid_op(kind, f, precision=precision, device=device, repeats=REPEATS, cal=self.cal)
            ratio = self._ratio(threads, device)
        finally:
            torch.set_num_threads(before)
        return {"kind": kind, "precision": precision, "threads": threads, "features": dict(f),
                "forward_s": fwd / ratio, "backward_s": bwd / ratio, "speed_ratio": ratio}

    def _ratio(self, threads: int, device: torch.device) -> float:
        """How much slower this machine runs now than when it was calibrated (its speed probe, once per thread
        count); 1 for a calibration without a probe."""
        if threads not in self._ratios:
            from scaletrain.predict.probe import probe_s

            calibrated = ((self.cal.get("probe") or {}).get("mean_s") or {}).get(str(threads))
            self._ratios[threads] = probe_s(threads, device) / calibrated if calibrated else 1.0
        return self._ratios[threads]


def mode_flag(text: str) -> str | float:
    """`--time-ops`: auto (BUDGET_S seconds), off, or the seconds this prediction may spend timing shapes."""
    from scaletrain.errors import UserError

    if text in MODES:
        return text
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise UserError(f"--time-ops {text!r}: give auto ({BUDGET_S:.0f} s), off, or the seconds a prediction may "
                        "spend timing the model's op shapes, such as 300")
    return seconds


def for_calibration(cal: dict[str, Any] | None, mode: str | float) -> OpShapes | None:
    """The shapes' timer of a calibration basis made on this machine (`auto`, or a budget in seconds), else None; None
    The shapes of a thread count whose probes moved while it was calibrated (calibration.unsteady) are left to the
    laws (OpShapes.time_missing): the probe's mean cannot turn a shape timed now into the speed each of that thread
    count's grid rows had (on two such calibrations it put the held-out steps 18-33% low). Judged per thread count
    since 2026-11-29: a calibration whose two-thread probes moved 16% and one thread's 4% had the one-thread
    held-out shapes left to their laws, LeNet-5's convolutions 23% under their timings elsewhere."""
    from scaletrain.distributed.env import cache_dir
    from scaletrain.predict.probe import this_host

    if mode == "off" or cal is None or not this_host(cal):
        return None
    name = hashlib.sha1(json.dumps(identity(cal), sort_keys=True).encode()).hexdigest()[:16]
    return OpShapes(cal, cache_dir() / "op-shapes" / f"{name}.json", BUDGET_S if mode == "auto" else float(mode))


def identity(cal: dict[str, Any]) -> dict[str, Any]:
    """What names one calibration: when and where it was made, and with which torch."""
    d = cal.get("device", {})
    return {"created": cal.get("created"), "host": d.get("host"), "device": d.get("name"),
            "torch": cal.get("torch_version")}


def _read(cache: Path | None) -> list[dict[str, Any]]:
    if cache is None or not cache.is_file():
        return []
    try:
        return list(json.loads(cache.read_text())["rows"])
    except (OSError, ValueError, KeyError, TypeError):
        return []  # a cache from another version, or torn: timed again


def _device(cal: dict[str, Any]) -> torch.device:
    return torch.device("cuda" if cal["device"]["type"] == "cuda" and torch.cuda.is_available() else "cpu")
