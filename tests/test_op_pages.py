"""An op is timed as a settled training rank runs it: with its heap holding the op's tensors, no fresh pages taken
from the kernel (predict/timing.PAGES). Timed at its first passes, a batch norm's backward at 256x16x32x32 took
12.0 ms against 5.4 settled here: a shape new to the timing process paged its tensors in."""

from __future__ import annotations

import itertools

import pytest
import torch

from predict_fixtures import NETWORK, calibrated_here, fake_calibration
from scaletrain.distributed.allocator import settle
from scaletrain.models.registry import build_model
from scaletrain.perf import timing as perf_timing
from scaletrain.predict import shapes as shapes_module
from scaletrain.predict import timing
from scaletrain.predict.ops import trace_ops
from scaletrain.predict.predictor import Predictor


def _batches(monkeypatch, rows):
    """perf/timing's timed calls (the sizing call, then the batches) made to take (seconds, fresh pages) from
    `rows`, in turn; the calls' counts kept."""
    rows, counter, calls = iter(rows), itertools.count(), []

    def per_call(fn, n, sync):
        seconds, pages = next(rows)
        for _ in range(pages):
            next(counter)
        calls.append(n)
        return seconds

    monkeypatch.setattr(perf_timing, "_per_call", per_call)
    monkeypatch.setattr(perf_timing, "minor_faults", lambda: next(counter))
    return calls


def test_a_timed_batch_that_took_fresh_pages_is_timed_again_and_left_out(monkeypatch):
    """The sizing call, then 9 s paging in 5,000 pages and three of 1 s with none: 1 s a call."""
    _batches(monkeypatch, [(0.5, 0), (9.0, 5000), (1.0, 0), (1.0, 0), (1.0, 0)])
    assert perf_timing.median_time(lambda: None, repeats=3, settled=True) == 1.0


def test_without_settled_pages_a_batch_that_paged_counts(monkeypatch):
    _batches(monkeypatch, [(0.5, 0), (9.0, 5000), (1.0, 0), (9.0, 5000)])
    assert perf_timing.median_time(lambda: None, repeats=3) == 9.0


def test_batches_that_page_alike_all_count_as_training_pages_such_a_tensor_in_every_step(monkeypatch):
    """A tensor above glibc's mmap threshold is paged in anew at every call, in training as in the timing."""
    calls = _batches(monkeypatch, [(0.5, 0), (2.0, 3000), (2.1, 3004), (1.9, 2999)])
    assert perf_timing.median_time(lambda: None, repeats=3, settled=True) == 2.0 and len(calls) == 4


def test_no_more_than_twice_the_repeats_are_timed(monkeypatch):
    calls = _batches(monkeypatch, [(0.5, 0), (1.0, 0)] + [(5.0, 900 + 100 * k) for k in range(9)])
    assert perf_timing.median_time(lambda: None, repeats=3, settled=True) == 1.0 and len(calls) == 1 + 6


def test_an_op_is_passed_until_a_pass_takes_no_fresh_pages(monkeypatch):
    taken = iter([0, 4000, 4000, 6000, 6000, 6003])  # before/after each pass: 4000, 2000, 3
    monkeypatch.setattr(timing, "minor_faults", lambda: next(taken))
    passes = []
    assert timing.settle_pages(lambda: passes.append(1)) == 3 and len(passes) == 3


def test_without_the_heap_passes_stop_when_the_pages_stop_falling_and_from_it_when_they_end(monkeypatch):
    """Without the heap, what every pass pages in (a tensor above the mmap threshold) would never settle: two alike
    are enough. From the heap, a pass paged in while the heap grew past the op's fragments, until none is."""
    deltas = [9000, 3000, 3000, 3000, 0]
    for heap, want in ((False, 3), (True, 5)):
        counts = iter([c for k in range(len(deltas)) for c in (sum(deltas[:k]), sum(deltas[:k + 1]))])
        monkeypatch.setattr(timing, "minor_faults", lambda: next(counts))
        assert timing.settle_pages(lambda: None, heap=heap) == want


@pytest.mark.skipif(settle().get("malloc") != "glibc, thresholds fixed", reason="glibc's thresholds only")
def test_a_batch_norms_timed_batches_take_no_fresh_pages(monkeypatch):
    """For real, in a steady heap (as every scaletrain process has): the batches time_op keeps took none."""
    taken = []
    real = perf_timing._per_call

    def spy(fn, calls, sync):
        before = perf_timing.minor_faults()
        seconds = real(fn, calls, sync)
        taken.append((calls, perf_timing.minor_faults() - before))
        return seconds

    monkeypatch.setattr(perf_timing, "_per_call", spy)
    timings = []  # each direction's calls of _per_call: its sizing call, then its timed batches

    def timed(*args, **kwargs):
        taken.clear()
        seconds = perf_timing.median_time(*args, **kwargs)
        timings.append(list(taken))
        return seconds

    monkeypatch.setattr(timing, "median_time", timed)
    forward_s, backward_s = timing.time_op(torch.nn.BatchNorm2d(16), [torch.randn(48, 16, 32, 32)], repeats=3)
    assert forward_s > 0 and backward_s > 0 and len(timings) == 2
    for calls in timings:
        assert sum(pages <= perf_timing.FRESH_PAGES + 1 for _, pages in calls[1:]) >= 3, timings


FRESH_TENSOR = """
import json, torch
from scaletrain.distributed.allocator import from_heap, settle
from scaletrain.perf.timing import minor_faults
settle("steady")
def pages():  # a 64 MiB tensor made, written and freed
    before = minor_faults()
    torch.ones(16 * 2**20)
    return minor_faults() - before
out = [pages() for _ in range(4)]
with from_heap() as applied:
    heap = [pages() for _ in range(24)]
print(json.dumps({"applied": applied, "pages": out, "heap": heap}))
"""


@pytest.mark.skipif(settle().get("allocator") != "steady", reason="glibc's steady thresholds only")
def test_from_the_heap_a_large_tensor_comes_to_take_no_fresh_pages_as_in_a_settled_step():
    """Above the mmap threshold (32 MiB) a tensor takes pages of its own every time, unless the heap serves it, as a
    training step's heap comes to (ResNet-50 at 224 px: none from its seventh step on) and a timing's does inside,
    once it has grown past the fragments that small allocations leave between large free chunks (a fresh process:
    the heap of this one may hold such a chunk already)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FRESH_TENSOR], capture_output=True, text=True, timeout=120)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["applied"] and min(result["pages"]) > 8000, result  # 16,384 pages of 4 KiB, every time
    assert min(result["heap"]) <= perf_timing.FRESH_PAGES, result
