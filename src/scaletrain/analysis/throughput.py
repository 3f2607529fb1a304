"""Steady-state steps and throughput from per-step records (pure functions; no printing).

A step is steady when it is past its epoch's warm-up (`warmup_steps`: loader start-up) and past the step at
which the rank's heap settled (`heap_settled_step`: a large model's first steps page in fresh memory from the
kernel, seconds of a step at ResNet-50's size on CPU, until the allocator's heap holds every tensor a step
makes). docs/metrics.md defines both."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

SETTLED_PAGES = 256  # fresh pages (1 MiB) a settled step may take beyond the run's steady level


def warmup_steps(steps_per_epoch: int) -> int:
    """Steps at the start of each epoch left out of steady-state throughput (loader start, allocator)."""
    return min(5, steps_per_epoch // 4)


def heap_settled_step(records: Iterable[Mapping[str, Any]]) -> int | None:
    """The `step` from which one rank's heap had settled: the first step that took no more fresh pages than the
    run's steady level (the median over its later half of steps), plus SETTLED_PAGES or half that level, whichever
    is more. Pages a settled heap still takes are part of its steady state: memory every step maps anew (a batch
    handed over by a loader worker; a tensor above glibc's mmap threshold that no free chunk of the heap fits),
    which varies from step to step (ResNet-50 at 224 px, two ranks: 0.1-0.9 million a step after its first
    warm-up of 2-3 million). None when the records carry no `fresh_pages` (recorded before they were)."""
    return settled_at([(r["step"], r["fresh_pages"]) for r in records if r.get("fresh_pages") is not None])


def settled_at(pages: Sequence[tuple[int, int]]) -> int | None:
    """`heap_settled_step` of one rank's (step, fresh pages) in step order (None for none)."""
    if not pages:
        return None
    later = sorted(n for _, n in pages[len(pages) // 2:])
    level = later[len(later) // 2]
    return next(step for step, n in pages if n <= level + max(SETTLED_PAGES, level // 2))


def settled_step(records_by_rank: Mapping[int, Iterable[Mapping[str, Any]]]) -> int | None:
    """The step from which every rank's heap had settled (ranks step in lockstep, so a run's steady steps start
    where its last rank's heap settled); None when no rank's records say."""
    steps = [s for s in (heap_settled_step(recs) for recs in records_by_rank.values()) if s is not None]
    return max(steps) if steps else None


def is_steady(record: Mapping[str, Any], skip: int, settled: int | None) -> bool:
    """Past its epoch's `skip` warm-up steps and not before step `settled`."""
    return record["step_in_epoch"] >= skip and (settled is None or record["step"] >= settled)


def steady_samples_per_s(records: Iterable[dict[str, Any]], world_size: int, steps_per_epoch: int,
                         settled: int | None = None) -> float | None:
    """Global training samples per second over steady-state steps: sum(samples) x world / sum(step time).

    Uses one rank's records (every rank waits for the slowest in the gradient all-reduce, so step times
    agree across ranks); `settled`, the run's `settled_step` (default: this rank's own). Returns None when no
    steady-state step exists (say so; never report 0).
    """
    records = list(records)
    skip = warmup_steps(steps_per_epoch)
    settled = heap_settled_step(records) if settled is None else settled
    steady = [r for r in records if is_steady(r, skip, settled)]
    seconds = sum(r["step_time_s"] for r in steady)
    if not steady or seconds <= 0:
        return None
    return sum(r["samples"] for r in steady) * world_size / seconds
