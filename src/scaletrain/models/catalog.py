"""Rows describing every built-in model at a given input size, for the `scaletrain models` listing."""

from __future__ import annotations

from typing import Any

import torch

from scaletrain.perf.flops import count_params, forward_flops
from scaletrain.models.registry import build_model, lookup, minimum_image_size, model_names


def model_row(name: str, *, image_size: int, in_channels: int, num_classes: int) -> dict[str, Any]:
    """One row: name, description, params, flops (one sample, None if impossible), note."""
    minimum = minimum_image_size(name, image_size=image_size)
    runnable = image_size >= minimum
    size = image_size if runnable else minimum
    # Meta tensors carry shapes only: building VGG-16 or counting its FLOPs allocates nothing and is fast.
    with torch.device("meta"):
        model = build_model(name, num_classes=num_classes, in_channels=in_channels, image_size=size)
        flops = forward_flops(model, (in_channels, size, size)) if runnable else None
    note = None if runnable else (
        f"needs images of at least {minimum}x{minimum} (params counted at {minimum}x{minimum})"
    )
    return {"name": name, "description": lookup(name).description, "params": count_params(model),
            "flops": flops, "note": note}


def model_rows(*, image_size: int, in_channels: int, num_classes: int) -> list[dict[str, Any]]:
    """One row per registry model, in name order; pure computation, no printing."""
    return [model_row(n, image_size=image_size, in_channels=in_channels, num_classes=num_classes)
            for n in model_names()]
