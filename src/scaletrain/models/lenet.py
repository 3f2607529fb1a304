"""LeNet-5 in its common modern form (LeCun et al. 1998 layout, ReLU and max-pool)."""

from __future__ import annotations

from torch import Tensor, nn

from scaletrain.models.sizing import Window, final_size, min_input_size, scaled
from scaletrain.models.weight_init import kaiming_init

CONV: Window = (5, 1, 0)  # unpadded, as in the original: a 32 px input reaches 5x5 before the FC layers
POOL: Window = (2, 2, 0)
WINDOWS: list[Window] = [CONV, POOL, CONV, POOL]


class LeNet5(nn.Module):
    """conv5x5(6)-pool-conv5x5(16)-pool-fc120-fc84-fc, flatten size derived from the image size."""

    def __init__(self, *, num_classes: int = 10, in_channels: int = 1, image_size: int = 32,
                 width: float = 1.0) -> None:
        super().__init__()
        c1, c2, f1, f2 = (scaled(c, width) for c in (6, 16, 120, 84))
        side = final_size(image_size, WINDOWS)
        if side < 1:
            raise ValueError(f"LeNet5 needs images of at least {min_image_size()} px, got {image_size}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, CONV[0]), nn.ReLU(inplace=True), nn.MaxPool2d(POOL[0], POOL[1]),
            nn.Conv2d(c1, c2, CONV[0]), nn.ReLU(inplace=True), nn.MaxPool2d(POOL[0], POOL[1]),
        )
        self.classifier = nn.Sequential(
            nn.Linear(c2 * side * side, f1), nn.ReLU(inplace=True),
            nn.Linear(f1, f2), nn.ReLU(inplace=True),
            nn.Linear(f2, num_classes),
        )
        kaiming_init(self)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x).flatten(1))


def min_image_size() -> int:
    """Smallest side for which both convs and both pools fit."""
    return min_input_size(WINDOWS)


def build_lenet(name: str, *, num_classes: int, in_channels: int, image_size: int, stem: str,
                width: float) -> LeNet5:
    """Registry builder for lenet5."""
    return LeNet5(num_classes=num_classes, in_channels=in_channels, image_size=image_size, width=width)
