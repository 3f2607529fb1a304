"""The reference network `scaletrain calibrate` trains for real to calibrate the training loop itself: a
small residual CNN (conv-BN-ReLU, residual additions, max-pool, a linear head). It is used nowhere else
and is none of the built-in models, so a validation on those models never tests the loop on the network
it was calibrated with. Accepted by `scaletrain train --model scaletrain.predict.refnet:build`."""

from __future__ import annotations

import torch
from torch import nn


class _Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


def build(num_classes: int = 10, in_channels: int = 3, image_size: int = 32) -> nn.Module:
    widths = (24, 48)
    layers: list[nn.Module] = [nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]),
                               nn.ReLU(inplace=True), _Block(widths[0]), nn.MaxPool2d(2),
                               nn.Conv2d(widths[0], widths[1], 3, padding=1, bias=False), nn.BatchNorm2d(widths[1]),
                               nn.ReLU(inplace=True), _Block(widths[1]),
                               nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(widths[1], num_classes)]
    return nn.Sequential(*layers)
