"""The one way a measurement is repeated on this machine: `samples` (untimed warm-up calls, then at least a
number of timed ones, on until a time budget is spent) and its median; `median_time`, a call too quick for the
clock timed in batches sized to it (calibration's ops and optimizer, a pipeline's host copies, the speed
probe, split's block costs). A collective's time is `distributed/group.py` `time_collective`'s (back to back
from a barrier, the slowest rank's); a whole training step's is the profiler's."""

from __future__ import annotations

import resource
import statistics
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def samples(measure: Callable[[], T], *, least: int, seconds: float = 0.0, most: int | None = None,
            warmup: int = 0, enough: Callable[[list[T]], bool] | None = None) -> list[T]:
    """`measure()` (which times one thing and returns its seconds, or a tuple of them) called `warmup` times
    untimed, then `least` times, and on while `seconds` have not passed since (at most `most` times).

    `enough(samples so far)`, when given, decides instead of the clock, after each call past `least`: two
    processes that time one exchange together must stop together, so they agree on it there (doctor's links)."""
    for _ in range(warmup):
        measure()
    out: list[T] = []
    start = time.perf_counter()
    done = enough or (lambda _: time.perf_counter() - start >= seconds)
    while len(out) < least or ((most is None or len(out) < most) and not done(out)):
        out.append(measure())
    return out


FRESH_PAGES = 16  # fresh pages a batch of calls may take beyond the fewest any batch took (the interpreter's own)


def median_time(fn: Callable[[], object], repeats: int = 5, min_batch_s: float = 0.01, sync=None,
                settled: bool = False) -> float:
    """Seconds per call of `fn`: warm up, size a batch of calls to `min_batch_s`, median over `repeats`.
    `settled`: only batches that took no more fresh pages from the kernel than the fewest any batch took (plus
    FRESH_PAGES) count, up to 2 x `repeats` batches timed: the others timed the paging in of memory the heap
    lacked, not `fn` (a tensor that is always paged in, above glibc's mmap threshold, is paged in by every batch
    alike, as in training)."""
    fn()
    calls = max(1, int(min_batch_s / max(_per_call(fn, 1, sync), 1e-7)))
    if not settled:
        return statistics.median(samples(lambda: _per_call(fn, calls, sync), least=repeats))
    rows: list[tuple[float, int]] = []  # (seconds per call, fresh pages) of each batch
    while True:
        before = minor_faults()
        seconds = _per_call(fn, calls, sync)
        rows.append((seconds, minor_faults() - before))
        least = min(pages for _, pages in rows)
        kept = [s for s, pages in rows if pages <= least + FRESH_PAGES]
        if len(kept) >= repeats or len(rows) >= 2 * repeats:
            return statistics.median(kept)


def minor_faults() -> int:
    """Fresh pages this process has taken from the kernel so far (minor page faults)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _per_call(fn: Callable[[], object], calls: int, sync) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    if sync:
        sync()
    return (time.perf_counter() - t0) / calls
