"""Timestamps for the profiler: host perf_counter on CPU, CUDA events on the GPU's stream.

A mark is taken where the training loop is; turning marks into seconds is deferred, so that on CUDA
the loop never waits for the GPU to catch up just to be measured.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class HostClock:
    """Marks are perf_counter() readings; a step's marks can be resolved as soon as it ends."""

    lag = 0  # steps to wait before resolving

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, origin: float, mark: float) -> float:
        return mark - origin

    def wait(self, mark: float) -> None:
        pass


class CudaClock:
    """Marks are CUDA events recorded on the current stream, so they time what the GPU did, in order.

    A step is resolved one step late: by then its events have (almost always) completed, and reading
    them costs no stall.
    """

    lag = 1

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()  # enqueued on the current stream: no synchronisation
        return event

    def seconds(self, origin: Any, mark: Any) -> float:
        return origin.elapsed_time(mark) / 1000.0  # both must have completed (see wait)

    def wait(self, mark: Any) -> None:
        mark.synchronize()  # note: a host-GPU sync point, reached one step late, so normally already done


def clock_for(device: torch.device) -> HostClock | CudaClock:
    return CudaClock() if device.type == "cuda" else HostClock()
