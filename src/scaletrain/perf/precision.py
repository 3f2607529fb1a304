"""What each `--precision` means to the tensors: the dtype autocast computes in, the dtype everything else is
made in, and the bytes an activation takes.

    fp32   float32 throughout
    bf16   autocast: convolutions and matmuls in bfloat16, weights and the rest in float32
    fp16   autocast + GradScaler (CUDA only)
    fp64   float64 throughout (torch's default dtype on every rank): for proving that a strategy computes what
           one process computes. Float32 sums taken in another order (an all-reduce, a split batch) differ in
           the last bits, and over tens of SGD steps those differences grow to ~1e-4 by amounts that depend on
           the CPU's kernels (AVX2 against AVX-512); in float64 they stay ~1e-12. Several times slower.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": None}
MADE_IN = {"fp64": torch.float64}  # the default dtype while a rank runs; float32 for the others
ACTIVATION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8}
PARAM_BYTES = {"fp64": 8}  # weights stay float32 under autocast


def param_bytes(precision: str) -> int:
    return PARAM_BYTES.get(precision, 4)


@contextlib.contextmanager
def made_in(precision: str) -> Iterator[None]:
    """Tensors created inside (weights, buffers, receive buffers) take `precision`'s dtype; restored after."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(MADE_IN.get(precision, torch.float32))
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def memory_format(device: torch.device) -> torch.memory_format:
    """How images and convolution weights are laid out on `device`: channels last (NHWC) on CUDA, where
    cuDNN's tensor-core convolutions and batch norm run on that layout without transposing (measured on an
    H200, docs/predict-validation.md, "A held-out GPU"); the contiguous NCHW layout elsewhere, so that CPU
    runs compute exactly what they always did."""
    return torch.channels_last if device.type == "cuda" else torch.contiguous_format


def place_model(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The model on `device`, its 4-D weights in the device's memory format."""
    return model.to(device, memory_format=memory_format(device)) if device.type == "cuda" else model.to(device)


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A batch on the device, its floating-point values in the dtype the model is made in (the loaders
    produce float32 in their own processes); images in the device's memory format."""
    dtype = torch.get_default_dtype() if x.is_floating_point() else None
    if x.dim() == 4 and device.type == "cuda":
        return x.to(device, dtype=dtype, non_blocking=True, memory_format=memory_format(device))
    return x.to(device, dtype=dtype, non_blocking=True)
