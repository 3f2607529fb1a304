"""A two-hidden-layer perceptron on flattened pixels, the simplest baseline."""

from __future__ import annotations

from torch import Tensor, nn

from scaletrain.models.sizing import scaled


class MLP(nn.Module):
    """flatten -> Linear(512w) -> ReLU -> Linear(256w) -> ReLU -> Linear(classes)."""

    def __init__(self, *, num_classes: int = 10, in_channels: int = 3, image_size: int = 32,
                 width: float = 1.0) -> None:
        super().__init__()
        h1, h2 = scaled(512, width), scaled(256, width)
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_channels * image_size * image_size, h1), nn.ReLU(inplace=True),
            nn.Linear(h1, h2), nn.ReLU(inplace=True),
            nn.Linear(h2, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def build_mlp(name: str, *, num_classes: int, in_channels: int, image_size: int, stem: str,
              width: float) -> MLP:
    """Registry builder for mlp."""
    return MLP(num_classes=num_classes, in_channels=in_channels, image_size=image_size, width=width)
