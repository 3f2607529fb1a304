"""The messages on a worker-server link: a 4-integer header, then (for some kinds) a payload.

    worker -> server                            server -> worker
    HELLO  [1, steps_per_epoch, 0, 0]           (sync: the initial parameters)
    PUSH   [2, version_read, step, 0] + grads   sync: the new parameters; async: [applied, staleness, version, 0]
    FETCH  [3, 0, 0, 0]                         [version, 0, 0, 0] + parameters
    DONE   [4, 0, 0, 0]                         -
    WAIT   [5, 0, 0, 0] (worker 0, at the end)  [workers done, workers dead, 0, 0] once every worker finished
    STATE  [6, reply, 0, 0] (at a checkpoint)   if reply: [nbytes, 0, 0, 0] + the server's state, packed

`version` counts the updates a shard has applied; a gradient's staleness is how many updates its shard
applied between the worker reading the parameters and the gradient arriving (0: none, fully fresh).
Parameters and gradients travel in the dtype the model is made in (float32; float64 with --precision fp64);
a server's state (its shard, optimizer state, counters) as the bytes of `torch.save`, in a uint8 tensor (`pack`), so any state dict crosses the link in one message.
"""

from __future__ import annotations

import io
from typing import Any

import torch

from scaletrain.perf.wire import PS_HEADER_BYTES

HELLO, PUSH, FETCH, DONE, WAIT, STATE = 1, 2, 3, 4, 5, 6
HEADER_BYTES = PS_HEADER_BYTES  # 4 int64 (perf/wire.py prices it)


def header(kind: int, a: int = 0, b: int = 0, c: int = 0) -> torch.Tensor:
    return torch.tensor([kind, a, b, c], dtype=torch.int64)


def empty_header() -> torch.Tensor:
    return torch.zeros(4, dtype=torch.int64)


def wait_all(works) -> None:
    for work in list(works):
        work.wait()


def pack(obj: Any) -> torch.Tensor:
    """`obj` serialized at once (a snapshot: later changes to its tensors do not show) as uint8."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def unpack(data: torch.Tensor) -> Any:
    """What `pack` serialized; weights_only, as checkpoints are loaded (tensors, numbers, str, containers)."""
    return torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu", weights_only=True)
