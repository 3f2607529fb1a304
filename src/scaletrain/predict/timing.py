"""Timing one operation's forward and backward on this machine, as the training loop runs it (calibration).

Forward: the module called in training mode with autograd recording (what `forward` pays per layer).
Backward: one pass of autograd over that op alone (`torch.autograd.grad` towards its input and its
parameters, the graph kept so it repeats); its input needs a gradient unless the op is the first layer.
Each figure is the median of `repeats` timed batches, each batch long enough (`min_batch_s`) for the
clock's resolution to vanish. In-place activations are timed out of place (the same arithmetic, and an
in-place op cannot run twice on one autograd graph).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
from torch import nn

from scaletrain.perf.precision import AUTOCAST


def median_time(fn: Callable[[], object], repeats: int = 5, min_batch_s: float = 0.01, sync=None) -> float:
    """Seconds per call of `fn`: warm up, size a batch of calls to `min_batch_s`, median over `repeats`."""
    fn()
    t0 = time.perf_counter()
    fn()
    if sync:
        sync()
    once = max(time.perf_counter() - t0, 1e-7)
    calls = max(1, int(min_batch_s / once))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if sync:
            sync()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def time_op(module: nn.Module, inputs: list[torch.Tensor], *, precision: str = "fp32", input_grad: bool = True,
            device: torch.device | None = None, repeats: int = 5, min_batch_s: float = 0.01) -> tuple[float, float]:
    """(forward seconds, backward seconds) of `module(*inputs)` in training mode."""
    device = device or torch.device("cpu")
    for m in module.modules():
        if hasattr(m, "inplace"):
            m.inplace = False
    module = module.to(device).train()
    leaves = [t.to(device).requires_grad_(input_grad and t.is_floating_point()) for t in inputs]
    xs = [t * 1.0 if t.requires_grad else t for t in leaves]  # not leaves: gradients stop at them
    params = [p for p in module.parameters() if p.requires_grad]
    dtype = AUTOCAST[precision]
    sync = torch.cuda.synchronize if device.type == "cuda" else None

    def forward() -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            return module(*xs)

    forward_s = median_time(forward, repeats, min_batch_s, sync)
    out = forward()
    wrt = [x for x in xs if x.requires_grad] + params
    if not out.requires_grad or not wrt:
        return forward_s, 0.0
    grad = torch.randn_like(out)
    backward_s = median_time(lambda: torch.autograd.grad(out, wrt, grad, retain_graph=True), repeats, min_batch_s,
                             sync)
    return forward_s, backward_s
