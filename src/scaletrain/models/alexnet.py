"""AlexNet (Krizhevsky et al. 2012), the single-tower variant with a 6x6 adaptive average pool."""

from __future__ import annotations

from torch import Tensor, nn

from scaletrain.models.sizing import Window, min_input_size, scaled
from scaletrain.models.weight_init import kaiming_init

# Spatial windows of the feature extractor in order; kept beside the layers so the minimum
# image size is computed from the same numbers the layers use.
CONV1: Window = (11, 4, 2)
POOL: Window = (3, 2, 0)
WINDOWS: list[Window] = [CONV1, POOL, (5, 1, 2), POOL, (3, 1, 1), (3, 1, 1), (3, 1, 1), POOL]


class AlexNet(nn.Module):
    """Five convs with three max-pools, 6x6 adaptive pool, then 4096-4096 classifier with dropout."""

    def __init__(self, *, num_classes: int = 1000, in_channels: int = 3, width: float = 1.0) -> None:
        super().__init__()
        c1, c2, c3, c4, c5 = (scaled(c, width) for c in (64, 192, 384, 256, 256))
        hidden = scaled(4096, width)

        def pool() -> nn.MaxPool2d:
            return nn.MaxPool2d(POOL[0], stride=POOL[1], padding=POOL[2])

        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, CONV1[0], stride=CONV1[1], padding=CONV1[2]), nn.ReLU(inplace=True), pool(),
            nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(inplace=True), pool(),
            nn.Conv2d(c2, c3, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(c3, c4, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(c4, c5, 3, padding=1), nn.ReLU(inplace=True), pool(),
        )
        self.pool = nn.AdaptiveAvgPool2d(6)
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Linear(c5 * 6 * 6, hidden), nn.ReLU(inplace=True),
            nn.Dropout(0.5), nn.Linear(hidden, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )
        kaiming_init(self)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.pool(self.features(x)).flatten(1))


def min_image_size() -> int:
    """Smallest side for which the last max-pool still has a 3x3 window to read."""
    return min_input_size(WINDOWS)


def build_alexnet(name: str, *, num_classes: int, in_channels: int, image_size: int, stem: str,
                  width: float) -> AlexNet:
    """Registry builder for alexnet."""
    return AlexNet(num_classes=num_classes, in_channels=in_channels, width=width)
