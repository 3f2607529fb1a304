"""ImageNet-family ResNets (He et al. 2016): ResNet-18/34 with basic blocks, ResNet-50 with bottlenecks."""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from scaletrain.models.sizing import Window, min_input_size, scaled
from scaletrain.models.weight_init import kaiming_init

STEMS = ("imagenet", "cifar")
STAGE_WIDTHS = (64, 128, 256, 512)


def _conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution with padding 1; no bias because a BatchNorm follows."""
    return nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)


def projection(in_ch: int, out_ch: int, stride: int) -> nn.Module:
    """Shortcut: identity when shapes match, else a strided 1x1 conv + BN (option B)."""
    if stride == 1 and in_ch == out_ch:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch))


class BasicBlock(nn.Module):
    """Two 3x3 convs plus shortcut, as in ResNet-18/34."""

    expansion = 1

    def __init__(self, in_ch: int, planes: int, stride: int = 1,
                 shortcut: Callable[[int, int, int], nn.Module] = projection) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_ch, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = shortcut(in_ch, planes, stride)

    @property
    def last_bn(self) -> nn.BatchNorm2d:
        """The BN closing the residual branch (zeroed by zero_init_residual)."""
        return self.bn2

    def residual(self, x: Tensor) -> Tensor:
        """The residual branch alone, before the addition."""
        return self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.residual(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand (x4) plus shortcut, as in ResNet-50."""

    expansion = 4

    def __init__(self, in_ch: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out_ch = planes * self.expansion
        self.conv1 = nn.Conv2d(in_ch, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        # Stride on the 3x3 rather than the first 1x1 ("v1.5"): the usual choice, same parameter count.
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = projection(in_ch, out_ch, stride)

    @property
    def last_bn(self) -> nn.BatchNorm2d:
        """The BN closing the residual branch (zeroed by zero_init_residual)."""
        return self.bn3

    def residual(self, x: Tensor) -> Tensor:
        """The residual branch alone, before the addition."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.bn3(self.conv3(out))

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.residual(x) + self.shortcut(x))


class ResNet(nn.Module):
    """Four-stage ResNet with an ImageNet (7x7/2 + max-pool) or CIFAR (3x3/1) stem."""

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        layers: tuple[int, int, int, int],
        *,
        num_classes: int = 1000,
        in_channels: int = 3,
        stem: str = "imagenet",
        width: float = 1.0,
        zero_init_residual: bool = True,
    ) -> None:
        super().__init__()
        if stem not in STEMS:
            raise ValueError(f"stem must be one of {STEMS}, got {stem!r}")
        widths = [scaled(w, width) for w in STAGE_WIDTHS]
        if stem == "imagenet":
            self.stem = nn.Sequential(
                nn.Conv2d(in_channels, widths[0], 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(widths[0]),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, stride=2, padding=1),
            )
        else:
            # Small images cannot afford a 4x down-sampling before the first stage.
            self.stem = nn.Sequential(
                _conv3x3(in_channels, widths[0]), nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True)
            )
        in_ch = widths[0]
        stages = []
        for i, (planes, count) in enumerate(zip(widths, layers)):
            blocks = []
            for j in range(count):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(block(in_ch, planes, stride))
                in_ch = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)
        kaiming_init(self)
        if zero_init_residual:
            # Each block starts as identity + shortcut, which eases large-batch training (Goyal et al. 2017).
            for module in self.modules():
                if isinstance(module, (BasicBlock, Bottleneck)):
                    nn.init.zeros_(module.last_bn.weight)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.pool(x).flatten(1))


LAYERS = {"resnet18": (BasicBlock, (2, 2, 2, 2)), "resnet34": (BasicBlock, (3, 4, 6, 3)),
          "resnet50": (Bottleneck, (3, 4, 6, 3))}


def resolve_stem(stem: str, image_size: int) -> str:
    """'auto' means the CIFAR stem for images up to 64 px, the ImageNet stem above."""
    if stem == "auto":
        return "cifar" if image_size <= 64 else "imagenet"
    return stem


def min_image_size(stem: str) -> int:
    """Smallest image side the stem plus the three stride-2 stages can process."""
    windows: list[Window] = [(7, 2, 3), (3, 2, 1)] if stem == "imagenet" else [(3, 1, 1)]
    windows += [(3, 2, 1)] * 3  # first 3x3 conv of stages 2-4 (its 1x1 shortcut gives the same size)
    return min_input_size(windows)


def build_resnet(name: str, *, num_classes: int, in_channels: int, image_size: int, stem: str,
                 width: float) -> ResNet:
    """Registry builder for resnet18/34/50."""
    block, layers = LAYERS[name]
    return ResNet(block, layers, num_classes=num_classes, in_channels=in_channels,
                  stem=resolve_stem(stem, image_size), width=width)
