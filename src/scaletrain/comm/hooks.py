"""DDP communication hooks for compressed gradients: linear codes all-reduce, the others all-gather.

Each hook reports the bytes it really puts on the wire to the profiler's recorder (when profiling),
so `bytes_sent` and the compression ratio are measured on what was sent, not on the gradient size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from scaletrain.distributed.group import current_world_size
from scaletrain.comm.compress import payload_bytes
from scaletrain.perf.wire import allgather_bytes, allreduce_bytes


@dataclass
class CompressState:
    """Hook state: the compressor, the group, and (when profiling) the recorder to report bytes to."""

    compressor: Any
    params: dict[int, int] = field(default_factory=dict)  # id(parameter) -> its index in the model
    group: Any = None
    recorder: Any = None


# no annotations on hooks: DDP compares them with its real classes and string annotations fail
def compressed_hook(state, bucket):
    """Encode the bucket, exchange (all-reduce or all-gather), decode the mean into the bucket's dtype."""
    comp, group = state.compressor, state.group
    world = current_world_size(group)
    buffer = bucket.buffer()
    # residuals are kept per parameter: DDP re-buckets after its first step and on every restart
    key = tuple((state.params[id(p)], p.numel()) for p in bucket.parameters()) if state.params else bucket.index()
    payload = comp.encode(buffer.to(torch.float32), key, world)
    sent = payload_bytes(payload)
    if comp.linear:
        if state.recorder is not None:
            state.recorder.note_wire(allreduce_bytes(sent, world))
        future = dist.all_reduce(payload[0], group=group, async_op=True).get_future()

        def decode_sum(fut):
            return comp.decode([payload[0]], buffer.numel(), world).to(buffer.dtype)

        return future.then(decode_sum)
    if state.recorder is not None:
        state.recorder.note_wire(allgather_bytes(sent, world))
    gathered = [[torch.empty_like(t) for t in payload] for _ in range(world)]
    works = [dist.all_gather([g[i] for g in gathered], t, group=group, async_op=True) for i, t in enumerate(payload)]
    future = torch.futures.collect_all([w.get_future() for w in works])

    def decode_all(fut):
        buffer.copy_(comp.decode(gathered, buffer.numel(), world))
        return buffer

    return future.then(decode_all)


def powersgd_state(rank: int, seed: int = 0):
    """PyTorch's PowerSGD state (Vogels et al. 2019) compressing from the second step on."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    return powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                  start_powerSGD_iter=2, random_seed=seed)
