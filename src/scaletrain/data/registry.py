"""Turn a dataset spec string ("digits", "bigdigits:SIZE", "synthetic", "imagefolder:PATH") into train/val
datasets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch.utils.data import Dataset

from scaletrain.data.bigdigits import build_bigdigits, parse_size
from scaletrain.data.digits import DEFAULT_DIGITS_SIZE, DIGITS_CLASSES, build_digits
from scaletrain.data.imagefolder import DEFAULT_IMAGEFOLDER_SIZE, build_imagefolder
from scaletrain.data.synthetic import build_synthetic
from scaletrain.errors import UserError


@dataclass(frozen=True)
class DataBundle:
    """Train/val datasets plus the shape facts a model needs."""

    name: str
    train: Dataset
    val: Dataset
    num_classes: int
    in_channels: int
    image_size: int


def dataset_names() -> list[str]:
    """The accepted spec forms, for help text and error messages."""
    return ["digits", "bigdigits:SIZE", "imagefolder:PATH", "synthetic"]


def default_image_size(spec: str) -> int:
    """The image side a dataset uses when --image-size is not given."""
    if spec.startswith("bigdigits:"):
        return parse_size(spec.partition(":")[2])
    return DEFAULT_IMAGEFOLDER_SIZE if spec.startswith("imagefolder:") else DEFAULT_DIGITS_SIZE


def _positive(value: int, what: str) -> int:
    """Validate a user-supplied count."""
    if int(value) < 1:
        raise UserError(f"{what} must be at least 1, got {value}")
    return int(value)


def build_datasets(spec: str, *, image_size: int | None = None, seed: int = 0, synthetic_samples: int = 4096,
                   synthetic_classes: int = 10, synthetic_channels: int = 3, augment: bool = True,
                   cache: Path | None = None) -> DataBundle:
    """Build the DataBundle for spec; bad specs or folders raise UserError. `cache`: the user's cache folder,
    where digits keeps its split (data/digits.py)."""
    if image_size is not None:
        _positive(image_size, "--image-size")
    kind, sep, arg = spec.partition(":")
    if kind == "digits" and not sep:
        train, val, size = build_digits(image_size, augment=augment, cache=cache)
        return DataBundle("digits", train, val, DIGITS_CLASSES, 1, size)
    if kind == "synthetic" and not sep:
        samples = _positive(synthetic_samples, "--synthetic-samples")
        classes = _positive(synthetic_classes, "--synthetic-classes")
        channels = _positive(synthetic_channels, "--synthetic-channels")
        if samples < 4:
            # val has samples // 4 items; an empty val set would break evaluation later and far from here.
            raise UserError(f"--synthetic-samples {samples} is too small: use 4 or more (val gets a quarter)")
        train, val, size = build_synthetic(image_size=image_size, seed=seed, samples=samples, classes=classes,
                                           channels=channels)
        return DataBundle("synthetic", train, val, classes, channels, size)
    if kind == "bigdigits":  # augment does not apply: the digit's place is already random (data/bigdigits.py)
        train, val, size, classes = build_bigdigits(arg, image_size, seed, cache)
        return DataBundle(spec, train, val, classes, 1, size)
    if kind == "imagefolder":
        train, val, classes, size = build_imagefolder(arg, image_size=image_size, augment=augment)
        return DataBundle(spec, train, val, len(classes), 3, size)
    raise UserError(f"unknown dataset '{spec}': use one of {', '.join(dataset_names())}")
