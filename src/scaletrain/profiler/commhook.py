"""Timing gradient communication through DDP's communication-hook interface.

The timed hook wraps whichever reduction runs (the default all-reduce or any other hook): it marks
when DDP hands it a ready bucket and when the bucket's future completes, and counts the bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from scaletrain.perf.wire import allreduce_bytes


@dataclass
class BucketTiming:
    """One bucket's reduction: marks (clock-specific), the gradient bytes, the bytes sent on the wire."""

    ready: Any
    nbytes: int
    wire: int
    done: Any = None
    raw_wire: int | None = None  # bytes sent without compression, when not an all-reduce's 2 (P-1)/P x nbytes
    ready_cpu: float | None = None  # the process's CPU clock at `ready` (splits backward's CPU time too)


@dataclass
class CommRecorder:
    """Collects this step's bucket timings; the profiler swaps in a fresh list at each step end."""

    clock: Any
    world_size: int
    delay_s: float = 0.0  # --inject comm=S: completion of every bucket held back S seconds
    buckets: list[BucketTiming] = field(default_factory=list)
    _wire: int | None = None

    def note_wire(self, nbytes: int) -> None:
        """Called by an inner hook that knows what it sends (compression, other collectives)."""
        self._wire = nbytes

    def take(self) -> list[BucketTiming]:
        taken, self.buckets = self.buckets, []
        return taken


def timed_hook(inner: Callable = default_hooks.allreduce_hook) -> Callable:
    """A DDP comm hook, state = (CommRecorder, inner state), that times `inner` bucket by bucket."""

    # no annotations: DDP checks them against the real classes, and postponed (string) ones fail that check
    def hook(state, bucket):
        recorder, inner_state = state
        buffer = bucket.buffer()
        nbytes = buffer.numel() * buffer.element_size()
        timing = BucketTiming(ready=recorder.clock.mark(), nbytes=nbytes, wire=0, ready_cpu=time.process_time())
        recorder.buckets.append(timing)
        recorder._wire = None
        future = inner(inner_state, bucket)  # runs synchronously up to launching the exchange
        timing.wire = recorder._wire if recorder._wire is not None else allreduce_bytes(nbytes, recorder.world_size)

        def finished(fut: torch.futures.Future) -> torch.Tensor:
            if recorder.delay_s:
                time.sleep(recorder.delay_s)  # runs on the communication thread: backward goes on meanwhile
            # on CUDA this event is recorded on a stream that waits for the reduction's kernels
            timing.done = recorder.clock.mark()
            return fut.value()

        return future.then(finished)

    return hook


def attach(ddp_model: torch.nn.Module, recorder: CommRecorder, inner: Callable | None = None,
           inner_state: Any = None) -> None:
    """Register the timed hook on a DDP model; `inner` defaults to the plain all-reduce."""
    group = inner_state if inner is not None else dist.group.WORLD
    if hasattr(inner_state, "recorder"):
        inner_state.recorder = recorder  # the inner hook reports the bytes it really sends
    ddp_model.register_comm_hook((recorder, group), timed_hook(inner or default_hooks.allreduce_hook))
