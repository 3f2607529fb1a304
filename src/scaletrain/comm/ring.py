"""Ring all-reduce from the literature (scatter-reduce, then all-gather) on point-to-point operations.

With P ranks the buffer is cut into P chunks. In P-1 scatter-reduce steps every rank sends one chunk
to its right neighbour and adds the chunk it receives from its left one; afterwards rank r holds the
full sum of chunk (r+1) mod P. In P-1 all-gather steps the summed chunks travel once around the ring.

    step:       scatter-reduce (P-1 steps)          all-gather (P-1 steps)
    rank r:     send c[r-s], recv+add c[r-s-1]      send c[r+1-s], recv c[r-s]      (indices mod P)

Each rank sends 2 (P-1) chunks of n/P elements: 2 (P-1)/P x n, nearly independent of P.
As a DDP communication hook it runs on its own thread, so buckets are reduced while backward goes on.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from scaletrain.distributed.group import current_rank, current_world_size
from scaletrain.comm.allreduce import AllReduce
from scaletrain.comm.setup import CommSetup
from scaletrain.perf.wire import ring_bytes


def ring_allreduce_(buffer: torch.Tensor, group: Any = None, wrap_group: Any = None) -> int:
    """Sum `buffer` over the group in place with a ring; returns the bytes this rank sent.

    `wrap_group` (the same ranks, another group) carries the link from the last rank back to rank 0:
    with 2 ranks that link joins the same pair the other way, and gloo does not overlap a pair's two
    directions within one group (measured: half the link rate), but does across groups."""
    world = current_world_size(group)
    if world == 1:
        return 0
    rank = current_rank(group)
    right = dist.get_global_rank(group, (rank + 1) % world) if group is not None else (rank + 1) % world
    left = dist.get_global_rank(group, (rank - 1) % world) if group is not None else (rank - 1) % world
    send_group = wrap_group if wrap_group is not None and rank == world - 1 else group
    recv_group = wrap_group if wrap_group is not None and rank == 0 else group
    chunks = list(buffer.tensor_split(world))
    incoming = torch.empty_like(chunks[0])
    sent = 0
    for step in range(world - 1):  # scatter-reduce
        out, into = chunks[(rank - step) % world], chunks[(rank - step - 1) % world]
        recv = incoming[: into.numel()]
        _exchange(out, recv, right, left, send_group, recv_group)
        into.add_(recv)
        sent += out.numel() * out.element_size()
    for step in range(world - 1):  # all-gather
        out, into = chunks[(rank + 1 - step) % world], chunks[(rank - step) % world]
        _exchange(out, into, right, left, send_group, recv_group)
        sent += out.numel() * out.element_size()
    return sent


def _exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int, send_group: Any,
              recv_group: Any) -> None:
    works = [dist.isend(send.contiguous(), right, group=send_group),
             dist.irecv(recv, left, group=recv_group)]
    for work in works:
        work.wait()


@dataclass
class RingState:
    """Hook state: a dedicated process group and one worker thread that reduces buckets in DDP's order."""

    group: Any = None
    wrap_group: Any = None
    recorder: Any = None
    _queue: queue.Queue = field(default_factory=queue.Queue)
    _thread: threading.Thread | None = None

    def submit(self, buffer: torch.Tensor) -> torch.futures.Future:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="scaletrain-ring", daemon=True)
            self._thread.start()
        future: torch.futures.Future = torch.futures.Future()
        self._queue.put((buffer, future))
        return future

    def stop(self) -> None:
        """End the worker thread (after the last bucket; before the groups are destroyed)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=10)  # (a thread stuck on a dead peer is a daemon: left behind)
            self._thread = None

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            buffer, future = item
            try:
                ring_allreduce_(buffer, self.group, self.wrap_group)
                future.set_result(buffer)
            except Exception as e:  # handed to DDP, which raises it in the training thread
                future.set_exception(e)


# no annotations: DDP checks them against its real classes
def ring_hook(state, bucket):
    """DDP hook: average the bucket with the ring (divide by P, then sum), on the ring's thread."""
    buffer = bucket.buffer()
    world = current_world_size(state.group)
    buffer.div_(world)
    if state.recorder is not None:
        rank = current_rank(state.group)
        state.recorder.note_wire(ring_bytes(buffer.numel(), buffer.element_size(), world, rank))
    return state.submit(buffer)


class RingAllReduce(AllReduce):
    """`--strategy ring`: DDP with this ring as its communication hook, on groups of its own (so that the
    ring's point-to-point traffic never mixes with DDP's collectives)."""

    network_fit = "ring"  # its buckets are priced at the calibration's fit of this ring
    gloo_lanes = 1  # one thread reduces them, one after the other (RingState)

    def hooks(self, model):
        return CommSetup(ring_hook, RingState(group=dist.new_group(), wrap_group=dist.new_group()))

    def close(self) -> None:
        if isinstance(self.comm.state, RingState):
            self.comm.state.stop()
        super().close()
