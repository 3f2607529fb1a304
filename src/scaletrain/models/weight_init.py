"""Weight initialisation shared by the built-in models."""

from __future__ import annotations

from torch import nn


def kaiming_init(model: nn.Module) -> None:
    """He-normal convs (fan_out, ReLU gain), unit-gamma/zero-beta norms; Linear keeps PyTorch's default."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            # fan_out keeps the backward signal's variance stable through deep ReLU stacks (He et al. 2015).
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
