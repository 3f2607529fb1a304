"""VGG-11 and VGG-16 with BatchNorm (Simonyan & Zisserman 2015; BN variant as commonly used)."""

from __future__ import annotations

from torch import Tensor, nn

from scaletrain.models.sizing import min_input_size, scaled
from scaletrain.models.weight_init import kaiming_init

POOL = "M"
CONFIGS: dict[str, list[int | str]] = {
    "vgg11": [64, POOL, 128, POOL, 256, 256, POOL, 512, 512, POOL, 512, 512, POOL],
    "vgg16": [64, 64, POOL, 128, 128, POOL, 256, 256, 256, POOL, 512, 512, 512, POOL, 512, 512, 512, POOL],
}
# Below this side the 7x7 pooled map would be mostly replicated pixels and the 4096-wide head
# would dwarf the features, so small images get a global-pool + single Linear head instead.
CLASSIC_HEAD_MIN_SIZE = 64


class VGG(nn.Module):
    """3x3-conv/BN/ReLU stacks separated by 2x2 max-pools, then a small or the classic classifier."""

    def __init__(self, config: list[int | str], *, num_classes: int = 1000, in_channels: int = 3,
                 width: float = 1.0, classic_head: bool = True) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = in_channels
        for item in config:
            if item == POOL:
                layers.append(nn.MaxPool2d(2, 2))
            else:
                out_ch = scaled(int(item), width)
                layers += [nn.Conv2d(in_ch, out_ch, 3, padding=1), nn.BatchNorm2d(out_ch), nn.ReLU(inplace=True)]
                in_ch = out_ch
        self.features = nn.Sequential(*layers)
        if classic_head:
            hidden = scaled(4096, width)
            self.pool: nn.Module = nn.AdaptiveAvgPool2d(7)
            self.classifier = nn.Sequential(
                nn.Linear(in_ch * 7 * 7, hidden), nn.ReLU(inplace=True), nn.Dropout(0.5),
                nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Dropout(0.5),
                nn.Linear(hidden, num_classes),
            )
        else:
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Linear(in_ch, num_classes))
        kaiming_init(self)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.pool(self.features(x)).flatten(1))


def min_image_size(name: str) -> int:
    """Smallest side that survives every 2x2 max-pool (the 3x3 padded convs keep the size)."""
    return min_input_size([(2, 2, 0)] * CONFIGS[name].count(POOL))


def build_vgg(name: str, *, num_classes: int, in_channels: int, image_size: int, stem: str,
              width: float) -> VGG:
    """Registry builder for vgg11/16: the classic head from 64 px up, the small head below."""
    return VGG(CONFIGS[name], num_classes=num_classes, in_channels=in_channels, width=width,
               classic_head=image_size >= CLASSIC_HEAD_MIN_SIZE)
