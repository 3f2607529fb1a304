"""The messages on a worker-server link: a 4-integer header, then (for some kinds) a float32 payload.

    worker -> server                            server -> worker
    HELLO  [1, steps_per_epoch, 0, 0]           (sync: the initial parameters)
    PUSH   [2, version_read, step, 0] + grads   sync: the new parameters; async: [applied, staleness, version, 0]
    FETCH  [3, 0, 0, 0]                         [version, 0, 0, 0] + parameters
    DONE   [4, 0, 0, 0]                         -
    WAIT   [5, 0, 0, 0] (worker 0, at the end)  [workers done, workers dead, 0, 0] once every worker finished

`version` counts the updates a shard has applied; a gradient's staleness is how many updates its shard
applied between the worker reading the parameters and the gradient arriving (0: none, fully fresh).
"""

from __future__ import annotations

import torch

HELLO, PUSH, FETCH, DONE, WAIT = 1, 2, 3, 4, 5
HEADER_BYTES = 4 * 8


def header(kind: int, a: int = 0, b: int = 0, c: int = 0) -> torch.Tensor:
    return torch.tensor([kind, a, b, c], dtype=torch.int64)


def empty_header() -> torch.Tensor:
    return torch.zeros(4, dtype=torch.int64)


def wait_all(works) -> None:
    for work in list(works):
        work.wait()
