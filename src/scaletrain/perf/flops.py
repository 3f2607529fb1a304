"""Parameter and forward-FLOP counts of a model."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def count_params(model: nn.Module) -> int:
    """Number of trainable parameters (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def forward_flops(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Forward FLOPs for ONE sample of shape `input_shape` (no batch dim), as FlopCounterMode counts them."""
    # FlopCounterMode counts matmuls and convolutions at 2 FLOPs per multiply-add and ignores element-wise
    # ops (BN, ReLU, pooling, additions, biases). Shapes are all it needs, so meta-device models work too.
    with counting(model) as counter:
        model(probe_input(model, input_shape))
    return int(counter.get_total_flops())


def probe_input(model: nn.Module, input_shape: tuple[int, ...], batch_size: int = 1) -> torch.Tensor:
    """Zeros of `batch_size` x `input_shape` on the model's device and in its dtype."""
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    return torch.zeros((batch_size, *input_shape), device=device, dtype=dtype)


@contextlib.contextmanager
def counting(model: nn.Module) -> Iterator[FlopCounterMode]:
    """A forward in eval mode without gradients, FLOPs counted; the model's mode restored afterwards."""
    was_training = model.training
    # eval(): train-mode BN rejects a batch of one with 1x1 maps, and dropout is irrelevant to FLOPs.
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            yield counter
    finally:
        model.train(was_training)
