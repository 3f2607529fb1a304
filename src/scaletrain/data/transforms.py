"""Small composable image transforms on PIL images and tensors, random only through torch's global RNG."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch
from PIL import Image

# ImageNet channel statistics: the conventional normalisation for RGB models trained from scratch or fine-tuned.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    """Normalise an int or (h, w) size into (h, w)."""
    if isinstance(size, int):
        return size, size
    h, w = size
    return int(h), int(w)


def _uniform(low: float, high: float) -> float:
    """One float in [low, high) from torch's global RNG (so DataLoader worker seeding governs it)."""
    return low + (high - low) * float(torch.rand((), dtype=torch.float32))  # not the default dtype: fp64 runs draw alike


def _randint(low: int, high_inclusive: int) -> int:
    """One int in [low, high_inclusive] from torch's global RNG."""
    return int(torch.randint(low, high_inclusive + 1, ()))


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms: Sequence[Callable]):
        self.transforms = list(transforms)

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img

    def decode_size(self, width: int, height: int) -> tuple[int, int] | None:
        """The least (w, h) a width x height image may be decoded at without the output losing detail (the first
        transform's word; None: the whole image)."""
        first = self.transforms[0] if self.transforms else None
        return first.decode_size(width, height) if hasattr(first, "decode_size") else None

    def __repr__(self) -> str:
        return f"Compose({self.transforms!r})"


class RandomResizedCrop:
    """Crop a random area/aspect-ratio region of a PIL image and resize it to size."""

    def __init__(self, size: int | Sequence[int], scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                 interpolation=Image.Resampling.BILINEAR, attempts: int = 10):
        if not (0 < scale[0] <= scale[1]) or not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"RandomResizedCrop needs 0 < min <= max for scale {scale} and ratio {ratio}")
        self.size = _pair(size)
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.interpolation = interpolation
        self.attempts = attempts

    def get_params(self, width: int, height: int) -> tuple[int, int, int, int]:
        """Pick (left, top, w, h) of the crop inside a width x height image."""
        area = width * height
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(self.attempts):
            target = area * _uniform(*self.scale)
            # Sampling the ratio in log space makes r and 1/r equally likely (tall and wide crops alike).
            r = math.exp(_uniform(log_lo, log_hi))
            w = int(round(math.sqrt(target * r)))
            h = int(round(math.sqrt(target / r)))
            if 0 < w <= width and 0 < h <= height:
                return _randint(0, width - w), _randint(0, height - h), w, h
        # Fallback for images whose shape keeps rejecting samples: the largest centred crop with an allowed ratio.
        aspect = width / height
        if aspect < self.ratio[0]:
            w, h = width, max(1, int(round(width / self.ratio[0])))
        elif aspect > self.ratio[1]:
            w, h = max(1, int(round(height * self.ratio[1]))), height
        else:
            w, h = width, height
        return (width - w) // 2, (height - h) // 2, w, h

    def decode_size(self, width: int, height: int) -> tuple[int, int]:
        """The smallest crop this may take (the least area, the extreme ratios) still `size` pixels across."""
        area = width * height * self.scale[0]
        w_min = min(width, math.sqrt(area * self.ratio[0]))
        h_min = min(height, math.sqrt(area / self.ratio[1]))
        return (min(width, math.ceil(width * self.size[1] / w_min)),
                min(height, math.ceil(height * self.size[0] / h_min)))

    def __call__(self, img: Image.Image) -> Image.Image:
        left, top, w, h = self.get_params(*img.size)
        # resize(box=...) crops and resamples in one pass, cheaper than crop() then resize().
        return img.resize((self.size[1], self.size[0]), self.interpolation, box=(left, top, left + w, top + h))

    def __repr__(self) -> str:
        return f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio})"


class RandomHorizontalFlip:
    """Mirror left-right with probability p (PIL image or [..., H, W] tensor)."""

    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, img):
        if float(torch.rand((), dtype=torch.float32)) >= self.p:
            return img
        if isinstance(img, torch.Tensor):
            return img.flip(-1)
        return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


class Resize:
    """Resize a PIL image: an int sets the shorter side (aspect kept), an (h, w) pair sets both."""

    def __init__(self, size: int | Sequence[int], interpolation=Image.Resampling.BILINEAR):
        self.size = size
        self.interpolation = interpolation

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """The (w, h) this transform produces for a width x height input."""
        if not isinstance(self.size, int):
            h, w = _pair(self.size)
            return w, h
        short, long = (width, height) if width <= height else (height, width)
        new_long = max(1, int(round(self.size * long / short)))
        return (self.size, new_long) if width <= height else (new_long, self.size)

    def decode_size(self, width: int, height: int) -> tuple[int, int]:
        return self.output_size(width, height)

    def __call__(self, img: Image.Image) -> Image.Image:
        size = self.output_size(*img.size)
        if size == img.size:
            return img
        return img.resize(size, self.interpolation)

    def __repr__(self) -> str:
        return f"Resize({self.size})"


class CenterCrop:
    """Crop the central (h, w) region of a PIL image or [..., H, W] tensor."""

    def __init__(self, size: int | Sequence[int]):
        self.size = _pair(size)

    @staticmethod
    def offsets(width: int, height: int, w: int, h: int) -> tuple[int, int]:
        """(left, top) that centre a w x h crop; odd leftovers go to the right/bottom."""
        return (width - w) // 2, (height - h) // 2

    def __call__(self, img):
        h, w = self.size
        if isinstance(img, torch.Tensor):
            height, width = img.shape[-2:]
            if h > height or w > width:
                raise ValueError(f"CenterCrop {self.size} is larger than the tensor's {(height, width)}")
            left, top = self.offsets(width, height, w, h)
            return img[..., top:top + h, left:left + w]
        # PIL pads with black if the crop is larger than the image, which is the sane outcome here.
        left, top = self.offsets(*img.size, w, h)
        return img.crop((left, top, left + w, top + h))

    def __repr__(self) -> str:
        return f"CenterCrop({self.size})"


class ToTensor:
    """PIL image (L, RGB, ...) to a float32 [C, H, W] tensor scaled to [0, 1]."""

    def __call__(self, img: Image.Image) -> torch.Tensor:
        if img.mode not in ("L", "RGB", "RGBA"):
            img = img.convert("RGB")
        # np.array (not asarray) copies into a writable buffer, which torch.from_numpy requires.
        arr = np.array(img, dtype=np.float32)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        return torch.from_numpy(arr).permute(2, 0, 1).contiguous().div_(255.0)

    def __repr__(self) -> str:
        return "ToTensor()"


class Normalize:
    """Per-channel (x - mean) / std on a [C, H, W] tensor."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        if len(mean) != len(std) or any(s <= 0 for s in std):
            raise ValueError(f"Normalize needs equal-length mean/std with std > 0, got {mean} and {std}")
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-3] != self.mean.shape[0]:
            raise ValueError(f"Normalize has {self.mean.shape[0]} channels of stats, tensor has {x.shape[-3]}")
        return (x - self.mean) / self.std

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()})"


def imagenet_train_transform(image_size: int) -> Compose:
    """Standard ImageNet training augmentation at image_size."""
    return Compose([
        RandomResizedCrop(image_size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
        RandomHorizontalFlip(),
        ToTensor(),
        Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def imagenet_val_transform(image_size: int) -> Compose:
    """Standard ImageNet evaluation: resize to image_size/0.875 on the short side, then centre-crop."""
    return Compose([
        Resize(int(round(image_size / 0.875))),
        CenterCrop(image_size),
        ToTensor(),
        Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])
