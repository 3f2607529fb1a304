"""The reference networks `scaletrain calibrate` trains for real to calibrate the training loop itself.

`build`: a small residual CNN (conv-BN-ReLU, residual additions, max-pool, a linear head), the mix of a
typical CNN. `build_plain`: convolutions and linear layers with ReLU only, so its step is nearly all
compute-bound arithmetic. `build_memory`: few multiply-adds and many memory-bound ops (batch norm,
pooling, element-wise). Between them they tell how much slower each group of ops runs inside a real
training step than timed alone (kinds.GROUP). They are used nowhere else and are none of the built-in
models, so a validation on those never tests the loop on a network it was calibrated with. Accepted by
`scaletrain train --model scaletrain.predict.refnet:build` (or `:build_plain`, `:build_memory`)."""

from __future__ import annotations

import torch
from torch import nn

NETS = {"refnet": "build", "plain": "build_plain", "memory": "build_memory"}  # name: factory in this module


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


class _MemoryBlock(nn.Module):
    """A 1x1 convolution among batch norms, a 3x3 average pool and a residual addition."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv = nn.Conv2d(channels, channels, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.pool = nn.AvgPool2d(3, stride=1, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool(torch.relu(self.bn2(self.conv(torch.relu(self.bn1(x))))))
        return x + y


def build(num_classes: int = 10, in_channels: int = 3, image_size: int = 32) -> nn.Module:
    widths = (24, 48)
    layers: list[nn.Module] = [nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]),
                               nn.ReLU(inplace=True), _Block(widths[0]), nn.MaxPool2d(2),
                               nn.Conv2d(widths[0], widths[1], 3, padding=1, bias=False), nn.BatchNorm2d(widths[1]),
                               nn.ReLU(inplace=True), _Block(widths[1]),
                               nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(widths[1], num_classes)]
    return nn.Sequential(*layers)


def build_plain(num_classes: int = 10, in_channels: int = 3, image_size: int = 32) -> nn.Module:
    side = max(1, image_size // 4)
    return nn.Sequential(nn.Conv2d(in_channels, 40, 3, padding=1), nn.ReLU(inplace=True),
                         nn.Conv2d(40, 40, 3, padding=1), nn.ReLU(inplace=True),
                         nn.Conv2d(40, 80, 3, stride=2, padding=1), nn.ReLU(inplace=True),
                         nn.Conv2d(80, 80, 3, stride=2, padding=1), nn.ReLU(inplace=True),
                         nn.Flatten(), nn.Linear(80 * side * side, 128), nn.ReLU(inplace=True),
                         nn.Linear(128, num_classes))


def build_memory(num_classes: int = 10, in_channels: int = 3, image_size: int = 32) -> nn.Module:
    width = 32
    return nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                         nn.ReLU(inplace=True), *[_MemoryBlock(width) for _ in range(3)], nn.MaxPool2d(2),
                         *[_MemoryBlock(width) for _ in range(2)], nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(width, num_classes))


def factory(name: str):
    """The builder of reference network `name` (NETS)."""
    return globals()[NETS[name]]
