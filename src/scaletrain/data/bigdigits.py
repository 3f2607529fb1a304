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
from torch.utils.data import Dataset

from scaletrain.data.digits import DIGITS_CLASSES, DIGITS_MAX, load_digits_split
from scaletrain.errors import UserError

DIGIT_SCALE = 2  # the 8 x 8 digit drawn 16 x 16
DIGIT = 8 * DIGIT_SCALE
SMALLEST = 64
TEXTURE = 0.6  # each of the texture's two layers of blobs spans 0..TEXTURE
GRAIN = 0.15  # fine noise's standard deviation
INK = 2.0  # a digit's full stroke, above the texture's brightest (2 x TEXTURE)
MEAN, STD = 0.60, 0.23  # the canvas's pixel statistics (measured on 64 samples at 256 px), for inputs near 0 +- 1


def parse_size(arg: str) -> int:
    """SIZE of `bigdigits:SIZE`: a whole number of pixels, at least SMALLEST and a multiple of 8."""
    try:
        size = int(arg)
    except ValueError:
        raise UserError(f"bigdigits:{arg}: give the canvas side in pixels, e.g. bigdigits:256") from None
    if size < SMALLEST or size % 8:
        raise UserError(f"bigdigits:{size}: the canvas side must be a multiple of 8 and at least {SMALLEST} (the "
                        f"digit is {DIGIT} px), e.g. bigdigits:256")
    return size


class BigDigits(Dataset):
    """Sample i: the canvas for digit i of the split, made on demand; `image_size` < `size` averages it down."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, size: int, image_size: int, seed: int, split: int):
        self.images, self.labels = images, labels
        self.size, self.image_size, self.seed, self.split = size, image_size, seed, split

    def __len__(self) -> int:
        return len(self.labels)

    def canvas(self, index: int) -> np.ndarray:
        """The full-size canvas of sample `index` (float32, about MEAN +- STD)."""
        rng = np.random.default_rng((self.seed, self.split, index))
        s = self.size
        coarse = _smooth(rng, s, s // DIGIT) * TEXTURE + _smooth(rng, s, max(1, s // 256)) * TEXTURE
        image = coarse + rng.normal(0.0, GRAIN, (s, s)).astype(np.float32)
        digit = np.kron(self.images[index] / DIGITS_MAX, np.ones((DIGIT_SCALE, DIGIT_SCALE))).astype(np.float32)
        y, x = rng.integers(0, s - DIGIT + 1, size=2)
        patch = image[y:y + DIGIT, x:x + DIGIT]
        np.maximum(patch, digit * INK, out=patch)  # the ink above any texture
        return image

    def __getitem__(self, index: int):
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} bigdigits samples")
        x = torch.from_numpy((self.canvas(index) - MEAN) / STD).unsqueeze(0)
        if self.image_size != self.size:  # area average: each output pixel the mean of a k x k block
            k = self.size // self.image_size
            x = x.reshape(1, self.image_size, k, self.image_size, k).mean(dim=(2, 4))
        return x.to(torch.get_default_dtype()), int(self.labels[index])


def _smooth(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Values in 0..1 varying smoothly over `cells` x `cells` cells of the canvas (bilinear between random knots)."""
    cells = max(1, cells)
    knots = rng.random((cells + 1, cells + 1), dtype=np.float32)
    at = np.linspace(0.0, cells, size, endpoint=False, dtype=np.float32)
    i = at.astype(np.int64)
    f = at - i
    rows = knots[i] * (1 - f)[:, None] + knots[i + 1] * f[:, None]  # (size, cells + 1)
    return rows[:, i] * (1 - f)[None, :] + rows[:, i + 1] * f[None, :]


def build_bigdigits(arg: str, image_size: int | None, seed: int, cache: Path | None = None):
    """(train, val, image_size, classes) for `bigdigits:SIZE`; `image_size` must divide SIZE."""
    size = parse_size(arg)
    side = size if image_size is None else int(image_size)
    if side > size or size % side:
        divisors = [size // k for k in (2, 4, 8)]
        raise UserError(f"--image-size {side} with bigdigits:{size}: the canvas is averaged down by a whole factor, "
                        f"so give a side that divides {size} (e.g. {', '.join(map(str, divisors))}) or leave "
                        "--image-size out")
    train_raw, val_raw = load_digits_split(cache)
    train = BigDigits(train_raw.images, train_raw.labels, size, side, seed, 0)
    val = BigDigits(val_raw.images, val_raw.labels, size, side, 0, 1)  # the same validation canvases for any --seed
    return train, val, side, DIGITS_CLASSES
