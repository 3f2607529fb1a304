"""The numbers every memory estimate shares (docs/perf.md, "Memory per rank"): the optimizer's state per
parameter, the copies of the parameters a data-parallel rank holds, and the bytes an activation takes at a
precision, and the names of a rank's memory parts. The one memory model (perf/footprint.py, comm/memory.py:
the pre-flight check, `predict`, `--image-size max`) and `split` (split/plan.py) read them here.

Under autocast every activation after the first convolution stays 16-bit (convolutions and matmuls produce
bf16/fp16, and batch norm, ReLU, pooling and additions keep their input's dtype: checked on CPU bf16), so an
activation takes ACTIVATION_BYTES[precision] whatever op made it."""

from __future__ import annotations

from scaletrain.perf.precision import ACTIVATION_BYTES

OPTIMIZER_STATE = {"sgd": 1, "nesterov": 1, "adagrad": 1, "adamw": 2, "plain-sgd": 0}
"""Buffers per parameter the optimizer keeps (momentum; AdamW's two moments; none for plain SGD)."""
PARTS = {"params": "parameters and optimizer state", "activations": "activations", "dataset": "dataset in memory",
         "batches": "batches", "runtime": "the process"}
"""The parts of a rank's memory (perf/footprint.Footprint's fields, prediction.json's `memory_bytes` keys) as a
table names them."""
TRACED_BYTES = 4  # shapes are traced in float32: a traced activation's bytes / 4 are its elements


def state_per_parameter(optimizer: str) -> int:
    return OPTIMIZER_STATE.get(optimizer, 1)


def data_parallel_copies(optimizer: str, buckets: bool = True) -> int:
    """Copies of the parameters one data-parallel rank holds: weights, gradients, the optimizer's state and
    (DDP) the flat bucket copy of the gradients."""
    return 2 + state_per_parameter(optimizer) + int(buckets)


def activations_at(traced_bytes: int, precision: str) -> int:
    """Bytes of activations traced in float32 (`traced_bytes`) as they are at `precision`."""
    return traced_bytes // TRACED_BYTES * ACTIVATION_BYTES.get(precision, TRACED_BYTES)
