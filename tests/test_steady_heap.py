"""Steady steps wait for the heap: a step is steady past its epoch's warm-up and past the step from which every
rank's heap had settled (the fresh pages each step records); the profiler records them, the summary, the
analysis, the pipeline stages and watch's mean so far all use that one definition."""

from __future__ import annotations

import mmap

import pytest

from scaletrain.analysis import analyze_run
from scaletrain.analysis.pipeline import stage_rows
from scaletrain.analysis.steps import steady
from scaletrain.analysis.throughput import SETTLED_PAGES, heap_settled_step, settled_step, steady_samples_per_s
from scaletrain.console.summary import steady_steps, warm_up_line
from scaletrain.profiler import StepProfiler
from scaletrain.watch.state import Observed, Step, heap_settled, mean_throughput

STEPS = 24  # 2 epochs of 12: each epoch's warm-up is its first 3 steps


def run(pages: list[int], slow_until: int = 0, step_s: float = 0.1) -> list[dict]:
    """One rank's records: steps before `slow_until` take twice as long (a heap still paging in)."""
    return [{"step": i, "epoch": i // 12, "step_in_epoch": i % 12, "samples": 8, "fresh_pages": n,
             "step_time_s": 2 * step_s if i < slow_until else step_s} for i, n in enumerate(pages)]


def test_the_heap_settles_at_the_first_step_near_its_steady_level():
    assert heap_settled_step(run([90_000, 40_000, 9_000, 200, 0, 5_000, 0] + [0] * 17)) == 3
    assert heap_settled_step(run([0] * STEPS)) == 0
    # pages every step takes anew (a loader worker's batch) are the steady level, not warm-up
    assert heap_settled_step(run([60_000, 30_000, 5_100, 4_800, 4_900] + [4_700] * 19)) == 2
    assert heap_settled_step(run([SETTLED_PAGES + 1, SETTLED_PAGES] + [0] * 22)) == 1
    assert heap_settled_step([{k: v for k, v in r.items() if k != "fresh_pages"} for r in run([0] * STEPS)]) is None
    # a settled heap that still maps some steps' tensors anew, more in some steps than others (ResNet-50 at 224 px
    # on two ranks, runs/r50-s16a): the level is the later half's median, not its fewest
    two_ranks = [2_324_311, 1_888_437, 1_348_565, 915_764, 238_357, 1_235_657, 878_134, 896_949, 370_072, 137_997,
                 241_493, 100_368]
    assert heap_settled_step(run(two_ranks + [None] * 12)) == 4


def test_steps_before_the_heap_settled_are_warm_up_even_past_the_epochs():
    records = run([10_000] * 7 + [0] * 17, slow_until=7)
    kept = steady(records)
    assert [r["step"] for r in kept] == list(range(7, 12)) + list(range(15, 24))  # epoch 1 still skips its 3
    assert all(r["step_time_s"] == 0.1 for r in kept)
    assert steady_samples_per_s(records, 2, 12) == pytest.approx(8 * 2 / 0.1)
    # without fresh pages (recorded before they were): each epoch's warm-up only, as before
    old = [{k: v for k, v in r.items() if k != "fresh_pages"} for r in records]
    assert [r["step"] for r in steady(old)] == list(range(3, 12)) + list(range(15, 24))


def test_the_run_waits_for_its_last_ranks_heap():
    by_rank = {0: run([10_000] * 2 + [0] * 22, slow_until=8), 1: run([10_000] * 8 + [0] * 16, slow_until=8)}
    assert settled_step(by_rank) == 8
    result = analyze_run(by_rank, {})
    assert result["step_time_mean_s"] == pytest.approx(0.1)  # rank 0 waited for rank 1 until step 8
    assert result["steady"] == {"steps": 13, "of": 24, "heap_settled_step": 8, "heap_warm_steps": 8,
                                "heap_settled_late": False}
    assert steady_samples_per_s(by_rank[0], 2, 12, settled=8) == pytest.approx(8 * 2 / 0.1)
    assert steady_samples_per_s(by_rank[0], 2, 12) < 8 * 2 / 0.1  # rank 0's own heap settled at step 2


def test_a_run_too_short_for_its_heap_says_so():
    result = analyze_run({0: run([10_000] * 14 + [0] * 10, slow_until=14)}, {})
    assert result["steady"]["heap_settled_late"] and result["steady"]["steps"] == 9  # epoch 1 leaves out step 14
    summary = {"steady": result["steady"]}
    assert warm_up_line(summary) == ("warning: the heap took fresh memory from the kernel for 14 of the run's 24 "
                                     "steps: the steady means rest on 9; train more steps (more samples or epochs)"
                                     " for firm ones")
    assert steady_steps(result["steady"]) == " over 9 of 24 steps (the heap took fresh memory for the first 14)"
    settled_early = analyze_run({0: run([10_000] * 2 + [0] * 22)}, {})["steady"]
    assert warm_up_line({"steady": settled_early}) is None


def test_pipeline_stages_average_the_same_steady_steps():
    def staged(rank, settle):
        return [{**r, "phases_s": {"forward": r["step_time_s"] / 2, "backward": r["step_time_s"] / 2}}
                for r in run([10_000] * settle + [0] * (STEPS - settle), slow_until=6)]

    rows = stage_rows({"stages": 2, "stage_blocks": [["a"], ["b"]]}, {0: staged(0, 2), 1: staged(1, 6)})
    assert [row["step_s"] for row in rows] == [pytest.approx(0.1)] * 2
    assert [row["steps"] for row in rows] == [15, 15]


def test_watch_mean_so_far_waits_for_the_heap():
    records = {0: run([10_000] * 2 + [0] * 22, slow_until=6), 1: run([10_000] * 6 + [0] * 18, slow_until=6)}
    steps = [Step(step=r["step"], epoch=r["epoch"], step_in_epoch=r["step_in_epoch"], samples=r["samples"],
                  step_time_s=r["step_time_s"], samples_per_s=None, t_start_s=None, fresh_pages=r["fresh_pages"])
             for r in records[0]]
    sums = [[0, 0.0] for _ in range(6)]
    for s in steps:
        sums[min(s.step_in_epoch, 5)][0] += s.samples
        sums[min(s.step_in_epoch, 5)][1] += s.step_time_s
    obs = Observed(root="r", config={"nproc": 2}, summary=None, summary_mtime=None, last_write=None, launched=None,
                   primary=0, steps=steps, windows=records, window=2000, window_full=False,
                   sums_by_position=sums, longest_epoch=12, settled=heap_settled(steps, records, False))
    assert obs.settled == 6 and heap_settled(steps, records, True) == 2  # the primary's alone: rank 0 settled at 2
    rate, source = mean_throughput(obs, 12, ended=False)
    assert source == "steady steps so far"
    assert rate == pytest.approx(steady_samples_per_s(records[0], 2, 12, settled=6)) == pytest.approx(160)


def touch_fresh_pages(nbytes: int) -> None:
    """Page in `nbytes` of memory no allocator held: an anonymous map of 4 KiB pages, each page written once."""
    buf = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)  # one fault per 4 KiB page, whatever the kernel's huge page setting
    for offset in range(0, nbytes, mmap.PAGESIZE):
        buf[offset] = 1
    buf.close()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_profiler_records_each_steps_fresh_pages(tmp_path, enabled):
    """A step that pages in 64 MiB of fresh memory records at least its 16,384 pages; one that makes nothing new
    records far fewer."""
    prof = StepProfiler(tmp_path, enabled=enabled)
    records = []
    for i, _ in enumerate(prof.data(iter(range(4)))):
        if i % 2 == 0:
            touch_fresh_pages(64 << 20)
        records += prof.step_end(samples=1, epoch=0)
    records += prof.flush()
    prof.close()
    pages = [r["fresh_pages"] for r in records]
    assert pages[0] >= 16_384 and pages[2] >= 16_384
    assert pages[1] < 4_096 and pages[3] < 4_096
