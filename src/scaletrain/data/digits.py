"""scikit-learn's 8x8 handwritten digits as small in-memory 1-channel image datasets."""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset


DIGITS_CLASSES = 10
DIGITS_MAX = 16.0  # load_digits pixel values are counts in 0..16
DEFAULT_DIGITS_SIZE = 32


@dataclass(frozen=True)
class DigitsSplit:
    """Raw 8x8 digits (values 0..16) of one split, with their indices into load_digits()."""

    images: np.ndarray  # [N, 8, 8] float64
    labels: np.ndarray  # [N] int64
    indices: np.ndarray  # [N] int64


SPLIT_CACHE = "digits-split-1.npz"
"""The split as arrays in the user's cache (distributed/env.cache_dir, given by the launcher and each rank): a process
that reads it skips importing scikit-learn, 2 s here in the launcher and again in every rank."""


def load_digits_split(cache: Path | None = None) -> tuple[DigitsSplit, DigitsSplit]:
    """The fixed stratified 80/20 train/val split (1437/360), independent of any training seed; kept in, and
    read from, the folder `cache` when one is given."""
    if cache is None:
        return _split_with_sklearn()
    path = cache / SPLIT_CACHE
    try:
        with np.load(path) as z:
            return (DigitsSplit(z["train_images"], z["train_labels"], z["train_indices"]),
                    DigitsSplit(z["val_images"], z["val_labels"], z["val_indices"]))
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):  # none yet, or unreadable: made again
        pass
    train, val = _split_with_sklearn()
    _keep(path, train, val)
    return train, val


def _keep(path: Path, train: DigitsSplit, val: DigitsSplit) -> None:
    """Written beside and renamed into place, so that ranks writing at once never leave half a file; a cache
    that cannot be written (read-only home) costs only the import next time."""
    from scaletrain.rundir import replace_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_atomic(path, lambda f: np.savez(f, train_images=train.images, train_labels=train.labels,
                                                train_indices=train.indices, val_images=val.images,
                                                val_labels=val.labels, val_indices=val.indices))
    except OSError:
        pass


def _split_with_sklearn() -> tuple[DigitsSplit, DigitsSplit]:
    # Imported lazily: sklearn is slow to import and only digits needs it.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float64)
    labels = np.asarray(bunch.target, dtype=np.int64)
    idx = np.arange(len(labels))
    # random_state=0 is fixed on purpose: the val set must not move when the user changes --seed.
    train_idx, val_idx = train_test_split(idx, test_size=0.2, random_state=0, stratify=labels)
    return (DigitsSplit(images[train_idx], labels[train_idx], train_idx),
            DigitsSplit(images[val_idx], labels[val_idx], val_idx))


def resize_digits(images: np.ndarray, image_size: int) -> torch.Tensor:
    """[N, 8, 8] raw digits -> [N, 1, S, S] float32 in [0, 1], bilinear."""
    x = torch.as_tensor(images, dtype=torch.float32).unsqueeze(1) / DIGITS_MAX
    if x.shape[-1] != image_size:
        # antialias only matters when shrinking; it keeps small sizes from aliasing the strokes away.
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False,
                          antialias=image_size < x.shape[-1])
    return x.clamp_(0.0, 1.0)


class TensorImageDataset(Dataset):
    """Images held in one tensor, with optional random translation (zero-padded) for training."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, max_shift: int = 0, fill: float = 0.0):
        if images.ndim != 4 or len(images) != len(labels):
            raise ValueError(f"need images [N,C,H,W] and N labels, got {tuple(images.shape)} and {len(labels)}")
        self.images = images.contiguous()
        self.labels = labels.to(torch.int64)
        self.max_shift = int(max_shift)
        # The value of a black pixel after normalisation, so shifted-in borders look like background.
        self.fill = float(fill)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        x = self.images[index]
        y = int(self.labels[index])
        s = self.max_shift
        if s <= 0:
            # A copy, not a view: a view would pin (and, sent from a worker, share) the whole split's storage.
            return x.clone(), y
        # Equivalent to pad-by-s then random crop, without allocating the padded image.
        dy, dx = (int(v) for v in torch.randint(-s, s + 1, (2,)))
        if dx == 0 and dy == 0:
            return x.clone(), y
        h, w = x.shape[-2:]
        out = torch.full_like(x, self.fill)
        out[:, max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
            x[:, max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
        return out, y


def build_digits(image_size: int | None = None, augment: bool = True, cache: Path | None = None):
    """(train, val, image_size) datasets for spec "digits", normalised with train mean/std."""
    size = DEFAULT_DIGITS_SIZE if image_size is None else int(image_size)
    train_raw, val_raw = load_digits_split(cache)
    train_x = resize_digits(train_raw.images, size)
    val_x = resize_digits(val_raw.images, size)
    mean = float(train_x.mean())
    std = float(train_x.std())
    train_x = (train_x - mean) / std
    val_x = (val_x - mean) / std
    fill = (0.0 - mean) / std
    shift = size // 16 if augment else 0
    train = TensorImageDataset(train_x, torch.as_tensor(train_raw.labels), max_shift=shift, fill=fill)
    val = TensorImageDataset(val_x, torch.as_tensor(val_raw.labels))
    return train, val, size
