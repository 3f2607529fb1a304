"""Two networks written for the performance model's validation and used nowhere else: the calibration never
saw them, so `make validate-predict` tests the predictor on models it knows nothing about.

    widenet   a wide, shallow CNN: 5x5 and strided 3x3 convolutions with bias, no normalisation, max-pool,
              a two-layer head with dropout
    dwnet     depthwise-separable blocks (depthwise 3x3 + pointwise 1x1, BN, ReLU6), a stride-2 stage,
              global average pooling
Use as `--model validation_models:widenet` with benchmarks/ on PYTHONPATH.
"""

from __future__ import annotations

from torch import nn


def widenet(num_classes: int = 10, in_channels: int = 3, image_size: int = 32) -> nn.Module:
    side = image_size // 4
    return nn.Sequential(
        nn.Conv2d(in_channels, 48, 5, padding=2), nn.ReLU(inplace=True),
        nn.Conv2d(48, 96, 3, stride=2, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(96, 96, 3, padding=1), nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(96 * side * side, 256), nn.ReLU(inplace=True), nn.Dropout(0.25),
        nn.Linear(256, num_classes))


class _Separable(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False)
        self.bn1 = nn.BatchNorm2d(cin)
        self.pw = nn.Conv2d(cin, cout, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.act = nn.ReLU6(inplace=True)

    def forward(self, x):
        return self.act(self.bn2(self.pw(self.act(self.bn1(self.dw(x))))))


def dwnet(num_classes: int = 10, in_channels: int = 3, image_size: int = 32) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU6(inplace=True),
        _Separable(32, 64, 1), _Separable(64, 128, 2), _Separable(128, 128, 1), _Separable(128, 256, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, num_classes))
