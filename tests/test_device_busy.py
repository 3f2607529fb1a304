"""The GPU's busy fraction in a torch.profiler window (profiler/device_busy.py), on traces written by hand (the trace
a CPU run writes, with no kernels and so no answer: test_profiler_e2e)."""

from __future__ import annotations

import pytest

from scaletrain.profiler.device_busy import device_busy, union_us


def test_union_counts_overlaps_once_and_gaps_not_at_all():
    assert union_us([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    assert union_us([]) == 0


def kernel(ts, dur, name="k"):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def test_a_launch_bound_window_is_mostly_idle():
    """Two steps of 1 ms each (host events span 0..2000 us): kernels of 100 us on two streams, overlapping once,
    behind launches of 10 us each."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::conv", "ts": 0, "dur": 2000},
              kernel(100, 100, "conv"), kernel(150, 100, "conv"), kernel(1100, 100, "bn"),
              {"ph": "i", "cat": "kernel", "name": "marker", "ts": 5}]  # not a complete event: ignored
    events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t, "dur": 10}
               for t in (90, 140, 1090)]
    events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 50, "dur": 30}]
    out = device_busy({"traceEvents": events}, steps=2, top=1)
    assert out["window_s"] == pytest.approx(2000e-6)
    assert out["busy_s"] == pytest.approx(250e-6)
    assert out["busy_fraction"] == pytest.approx(0.125)
    assert out["kernels_per_step"] == 1.5 and out["launches_per_step"] == 1.5
    assert out["launch_s_per_step"] == pytest.approx(15e-6)
    assert out["top_kernels"] == [{"name": "conv", "s_per_step": pytest.approx(100e-6)}]
