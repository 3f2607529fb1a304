"""`bigdigits:SIZE`: a real digit, small, somewhere on a large textured canvas (docs/datasets.md).

Each sample is a SIZE x SIZE one-channel image: a smooth random texture (blobs the size of a digit and larger)
with fine grain, and one of scikit-learn's digits (the same 1,437 / 360 split as `digits`) scaled up DIGIT_SCALE
times (16 x 16 px) and pasted at a random place. Resolution is what matters: downsampled 8x (`--image-size
SIZE/8`), the digit is 2 x 2 pixels under the texture and cannot be read; at full size it can. Samples are made
when asked for (never the whole dataset in memory: SIZE may be tens of thousands), the same for a given index in
every process and epoch: a numpy generator seeded by (seed, split, index)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from scaletrain.data.digits import DIGITS_CLASSES, DIGITS_MAX, load_digits_split
from scaletrain.errors import UserError

DIGIT_SCALE = 2  # the 8 x 8 digit drawn 16 x 16
DIGIT = 8 * DIGIT_SCALE
SMALLEST = 2 * DIGIT  # so that the digit's place varies, and an 8x downsample still has 4 x 4 pixels
TEXTURE = 0.6  # each of the texture's two layers of blobs spans 0..TEXTURE
GRAIN = 0.15  # fine noise's standard deviation (uniform noise, one value per pixel)
INK = 2.0  # a digit's full stroke, above the texture's brightest (2 x TEXTURE + the grain's 0.26)
MEAN, STD = 0.60, 0.23  # the canvas's pixel statistics (measured on 64 samples at 256 px), for inputs near 0 +- 1
_BYTE_STD = 256 / 12 ** 0.5  # the standard deviation of a uniform byte


def parse_size(arg: str) -> int:
    """SIZE of `bigdigits:SIZE`: a whole number of pixels, at least SMALLEST."""
    try:
        size = int(arg)
    except ValueError:
        raise UserError(f"bigdigits:{arg}: give the canvas side in pixels, e.g. bigdigits:256") from None
    if size < SMALLEST:
        raise UserError(f"bigdigits:{size}: the canvas side must be at least {SMALLEST} (twice the digit's {DIGIT} "
                        "px), e.g. bigdigits:256")
    return size


class BigDigits(Dataset):
    """Sample i: the canvas for digit i of the split, made on demand; `image_size` < `size` averages it down.
    No augmentation: the digit's place is already random, and a sample must stay a function of its index."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, size: int, image_size: int, seed: int, split: int):
        self.images, self.labels = images, labels
        self.size, self.image_size, self.seed, self.split = size, image_size, seed, split

    def __len__(self) -> int:
        return len(self.labels)

    def canvas(self, index: int) -> torch.Tensor:
        """The full-size canvas of sample `index`: float32 [size, size], about MEAN +- STD, the ink up to INK."""
        rng = np.random.default_rng((self.seed, self.split, index))
        s = self.size
        image = _texture(rng, s)
        # The grain as bytes: a quarter of the memory traffic of float noise, and ten times faster to draw.
        grain = torch.from_numpy(rng.integers(0, 256, (s, s), dtype=np.uint8))
        image.add_(grain, alpha=GRAIN / _BYTE_STD).sub_(127.5 * GRAIN / _BYTE_STD)
        y, x = (int(v) for v in rng.integers(0, s - DIGIT + 1, size=2))
        digit = np.kron(self.images[index] * (INK / DIGITS_MAX), np.ones((DIGIT_SCALE, DIGIT_SCALE)))
        patch = image[y:y + DIGIT, x:x + DIGIT]
        torch.maximum(patch, torch.from_numpy(digit.astype(np.float32)), out=patch)  # the ink above any texture
        return image

    def __getitem__(self, index: int):
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} bigdigits samples")
        x = self.canvas(index).sub_(MEAN).div_(STD).unsqueeze(0)
        if self.image_size != self.size:  # area average: each output pixel the mean of its block of the canvas
            x = F.adaptive_avg_pool2d(x, self.image_size)
        return x, int(self.labels[index])  # float32 whatever the default dtype, as digits and synthetic


def _texture(rng: np.random.Generator, size: int) -> torch.Tensor:
    """Two layers of smooth blobs, each 0..TEXTURE: one varying over cells the digit's size, one over an eighth
    of the canvas or more. The coarse layer is added at the fine layer's knots, so that one bilinear upsampling
    (the only full-size work here) draws both."""
    fine, coarse = max(1, size // DIGIT), max(1, size // 256)
    knots = torch.from_numpy(rng.random((1, 1, coarse + 1, coarse + 1), dtype=np.float32))
    knots = F.interpolate(knots, size=(fine + 1, fine + 1), mode="bilinear", align_corners=True)
    knots += torch.from_numpy(rng.random((fine + 1, fine + 1), dtype=np.float32))
    return F.interpolate(knots * TEXTURE, size=(size, size), mode="bilinear", align_corners=True)[0, 0]


def build_bigdigits(arg: str, image_size: int | None, seed: int, cache: Path | None = None):
    """(train, val, image_size, classes) for `bigdigits:SIZE`; `image_size` at most SIZE."""
    size = parse_size(arg)
    side = size if image_size is None else int(image_size)
    if side > size:
        raise UserError(f"--image-size {side} with bigdigits:{size}: the canvas can only be averaged down: give "
                        f"--image-size {size} or less (e.g. {size // 8} for 8x downsampled), or leave it out")
    train_raw, val_raw = load_digits_split(cache)
    train = BigDigits(train_raw.images, train_raw.labels, size, side, seed, 0)
    val = BigDigits(val_raw.images, val_raw.labels, size, side, 0, 1)  # the same validation canvases for any --seed
    return train, val, side, DIGITS_CLASSES
