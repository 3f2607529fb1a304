"""Model registry: name -> builder and minimum image size; `build_model` also resolves user factories."""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from torch import nn

from scaletrain.errors import UserError
from scaletrain.models import alexnet, cifar_resnet, lenet, mlp, resnet, vgg
from scaletrain.models.sizing import size_error
from scaletrain.models.user_factory import build_user_model

STEM_CHOICES = ("auto", "imagenet", "cifar")


@dataclass(frozen=True)
class ModelSpec:
    """One registry entry; `min_size(stem)` takes the resolved stem (ignored by fixed-stem models)."""

    name: str
    description: str
    build: Callable[..., nn.Module]
    min_size: Callable[[str], int]
    stems: tuple[str, ...] = ()  # explicit stems accepted; empty = fixed stem, only "auto"


def _fixed(minimum: Callable[[], int]) -> Callable[[str], int]:
    return lambda stem: minimum()


def _specs() -> dict[str, ModelSpec]:
    entries = [
        ModelSpec("resnet18", "ResNet-18, basic blocks [2,2,2,2] (He et al. 2016)",
                  partial(resnet.build_resnet, "resnet18"), resnet.min_image_size, resnet.STEMS),
        ModelSpec("resnet34", "ResNet-34, basic blocks [3,4,6,3] (He et al. 2016)",
                  partial(resnet.build_resnet, "resnet34"), resnet.min_image_size, resnet.STEMS),
        ModelSpec("resnet50", "ResNet-50, bottleneck blocks [3,4,6,3] (He et al. 2016)",
                  partial(resnet.build_resnet, "resnet50"), resnet.min_image_size, resnet.STEMS),
        ModelSpec("resnet20", "CIFAR ResNet-20, 16/32/64 channels, parameter-free shortcuts",
                  partial(cifar_resnet.build_cifar_resnet, "resnet20"), _fixed(cifar_resnet.min_image_size)),
        ModelSpec("resnet56", "CIFAR ResNet-56, 16/32/64 channels, parameter-free shortcuts",
                  partial(cifar_resnet.build_cifar_resnet, "resnet56"), _fixed(cifar_resnet.min_image_size)),
        ModelSpec("vgg11", "VGG-11 with BatchNorm (Simonyan & Zisserman 2015)",
                  partial(vgg.build_vgg, "vgg11"), lambda stem: vgg.min_image_size("vgg11")),
        ModelSpec("vgg16", "VGG-16 with BatchNorm (Simonyan & Zisserman 2015)",
                  partial(vgg.build_vgg, "vgg16"), lambda stem: vgg.min_image_size("vgg16")),
        ModelSpec("alexnet", "AlexNet, single-tower (Krizhevsky et al. 2012)",
                  partial(alexnet.build_alexnet, "alexnet"), _fixed(alexnet.min_image_size)),
        ModelSpec("lenet5", "LeNet-5 with ReLU and max-pool (LeCun et al. 1998)",
                  partial(lenet.build_lenet, "lenet5"), _fixed(lenet.min_image_size)),
        ModelSpec("mlp", "Perceptron on flattened pixels, hidden 512-256",
                  partial(mlp.build_mlp, "mlp"), _fixed(lambda: 1)),
    ]
    return {spec.name: spec for spec in entries}


REGISTRY: dict[str, ModelSpec] = _specs()


def model_names() -> list[str]:
    """Names of the built-in models, sorted."""
    return sorted(REGISTRY)


def _check_positive_int(label: str, value: object) -> None:
    # bool is an int subclass; True as a class count is surely a mistake.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{label} must be a positive integer (got {value!r}): pass e.g. --{label.replace('_', '-')} 10")


def _check_width(width: object) -> float:
    if isinstance(width, bool) or not isinstance(width, (int, float)) or not math.isfinite(width) or width <= 0:
        raise UserError(f"width must be a positive number (got {width!r}): pass e.g. --width 0.5 or --width 2")
    return float(width)


def lookup(name: str) -> ModelSpec:
    """The registry entry for `name`, or a UserError suggesting the closest name."""
    if name in REGISTRY:
        return REGISTRY[name]
    close = difflib.get_close_matches(name.lower(), model_names(), n=1)
    hint = f": did you mean '{close[0]}'?" if close else "."
    raise UserError(
        f"unknown model '{name}'{hint} Run `scaletrain models` to list them, or pass package.module:factory"
    )


def resolve_stem(spec: ModelSpec, stem: str, image_size: int) -> str:
    """Validate `stem` for this model and resolve 'auto' (CIFAR stem up to 64 px) to a concrete stem."""
    if stem not in STEM_CHOICES:
        raise UserError(f"unknown stem {stem!r}: use one of {', '.join(STEM_CHOICES)}")
    if not spec.stems:
        if stem != "auto":
            with_stems = ", ".join(n for n in model_names() if REGISTRY[n].stems)
            raise UserError(f"{spec.name} has a fixed stem; --stem {stem} applies only to {with_stems}: "
                            "drop --stem or pick one of those")
        return stem
    return resnet.resolve_stem(stem, image_size)


def minimum_image_size(name: str, *, image_size: int, stem: str = "auto") -> int:
    """Smallest square image side the built-in model `name` can run at with this stem choice."""
    spec = lookup(name)
    return spec.min_size(resolve_stem(spec, stem, image_size))


def build_model(name: str, *, num_classes: int, in_channels: int, image_size: int,
                stem: str = "auto", width: float = 1.0) -> nn.Module:
    """Build a registry model or a user `package.module:factory`; bad input raises a one-line UserError."""
    _check_positive_int("num_classes", num_classes)
    _check_positive_int("in_channels", in_channels)
    _check_positive_int("image_size", image_size)
    if ":" in name:
        if stem != "auto" or width != 1.0:
            raise UserError(f"--stem and --width apply only to built-in models, not '{name}': "
                            "drop them or make the factory take its own settings")
        return build_user_model(name, num_classes=num_classes, in_channels=in_channels, image_size=image_size)
    spec = lookup(name)
    width = _check_width(width)
    concrete = resolve_stem(spec, stem, image_size)
    minimum = spec.min_size(concrete)
    if image_size < minimum:
        raise size_error(name, minimum, image_size)
    return spec.build(num_classes=num_classes, in_channels=in_channels, image_size=image_size,
                      stem=concrete, width=width)


@functools.lru_cache(maxsize=8)
def meta_model(name: str, *, num_classes: int, in_channels: int, image_size: int, stem: str = "auto",
               width: float = 1.0) -> nn.Module:
    """build_model's model on the meta device, one per setting for the process: what predictions read (shapes,
    FLOPs, bytes: its walks at every batch kept with it, perf/walk.layer_graph), never a model to train or change."""
    import torch

    with torch.device("meta"):
        return build_model(name, num_classes=num_classes, in_channels=in_channels, image_size=image_size, stem=stem,
                           width=width)
