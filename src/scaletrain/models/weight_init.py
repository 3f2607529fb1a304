"""Weight initialisation shared by the built-in models."""

from __future__ import annotations

from torch import nn


def kaiming_init(model: nn.Module) -> None:
    """He-normal convs (fan_out, ReLU gain), unit-gamma/zero-beta norms; Linear keeps PyTorch's default. A model on
    the meta device (shapes alone, for a walk) has no values to set: torch runs normal_ there as its Python
    decomposition, most of building a ResNet-50 there."""
    if any(p.is_meta for p in model.parameters()):
        return
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            # fan_out keeps the backward signal's variance stable through deep ReLU stacks (He et al. 2015).
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
