"""One row per leaf module of a model: output shape, parameters, forward FLOPs and the bytes of its output.

Traced in one forward pass with forward hooks under FlopCounterMode. Built on PyTorch's `meta` device
(`with torch.device("meta"): model = ...`) the model allocates and computes nothing, only shapes travel;
a model on a real device runs one real forward of a batch of zeros, as perf.flops.forward_flops does.
The base the per-layer time model grows on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from scaletrain.perf.flops import counting, probe_input

OUTSIDE = "(outside leaf modules)"  # the name of the row for FLOPs a container computes itself


@dataclass(frozen=True)
class Layer:
    """A leaf module's costs for one forward pass of the batch (all calls summed when it runs twice)."""

    name: str  # its qualified name in the model, as named_modules gives it ("layer1.0.conv1")
    kind: str  # its class name ("Conv2d")
    output_shape: tuple  # batch first; a tuple of shapes for several outputs; () if it never ran
    params: int  # trainable parameters it owns, as perf.flops.count_params counts them
    param_bytes: int  # their bytes
    flops: int  # FlopCounterMode's count: 2 per multiply-add of matmuls and convolutions, element-wise 0
    activation_bytes: int  # bytes of its outputs (what autograd may keep for backward); in-place ops too
    calls: int  # forward calls in the pass (a ReLU reused in a block: 2)


def layer_table(model: nn.Module, input_shape: tuple[int, ...], batch_size: int = 1) -> list[Layer]:
    """Rows for the leaf modules in the order they first run (never-run leaves last), for one forward pass
    of `batch_size` samples of `input_shape` (no batch dimension). FLOPs of operations a container runs
    itself (a functional matmul in its forward) land in one last row named OUTSIDE, so the FLOPs always sum
    to the model's; it is absent when every FLOP is inside a leaf."""
    leaves = [(name, m) for name, m in model.named_modules() if not list(m.children())]
    order: list[int] = []
    calls, flops, act, shapes = ({} for _ in range(4))

    def before(i):
        def hook(_m, _inputs):
            calls[i] = calls.get(i, 0) + 1
            flops[i] = flops.get(i, 0) - counter.get_total_flops()
        return hook

    def after(i):
        def hook(_m, _inputs, out):
            flops[i] += counter.get_total_flops()
            act[i] = act.get(i, 0) + _bytes(out)
            shapes[i] = _shape(out)
            if i not in order:
                order.append(i)
        return hook

    x = probe_input(model, input_shape, batch_size)
    handles = []
    for i, (_, m) in enumerate(leaves):
        handles += [m.register_forward_pre_hook(before(i)), m.register_forward_hook(after(i))]
    try:
        with counting(model) as counter:  # eval mode, as forward_flops
            model(x)
    finally:
        for h in handles:
            h.remove()
    seen: set[int] = set()  # a parameter shared by two leaves counts at the first to run
    ran = order + [i for i in range(len(leaves)) if i not in order]
    rows = [_row(*leaves[i], seen, shapes.get(i, ()), flops.get(i, 0), act.get(i, 0), calls.get(i, 0))
            for i in ran]
    outside = int(counter.get_total_flops()) - sum(r.flops for r in rows)
    if outside:
        rows.append(Layer(OUTSIDE, "", (), 0, 0, outside, 0, 0))
    return rows


def _row(name: str, m: nn.Module, seen: set[int], shape: tuple, flops: int, act: int, calls: int) -> Layer:
    own = [p for p in m.parameters(recurse=False) if p.requires_grad and id(p) not in seen]
    seen.update(id(p) for p in own)
    return Layer(name, type(m).__name__, shape, sum(p.numel() for p in own),
                 sum(p.numel() * p.element_size() for p in own), int(flops), act, calls)


def _shape(out) -> tuple:
    if isinstance(out, torch.Tensor):
        return tuple(out.shape)
    if isinstance(out, (list, tuple)):
        return tuple(_shape(o) for o in out if isinstance(o, (torch.Tensor, list, tuple)))
    return ()


def _bytes(out) -> int:
    if isinstance(out, torch.Tensor):
        return out.numel() * out.element_size()
    if isinstance(out, (list, tuple)):
        return sum(_bytes(o) for o in out)
    return 0
