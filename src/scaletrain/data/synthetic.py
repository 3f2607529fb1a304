"""Random tensors generated per index: throughput data with no I/O and no memory footprint."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

DEFAULT_SYNTHETIC_SIZE = 32
_SEED_STRIDE = 1_000_003  # a prime, so (seed, index) pairs map to distinct generator seeds for realistic sizes
_SIGNAL = 0.5  # strength of the class-dependent channel offset, small next to the unit noise


class SyntheticDataset(Dataset):
    """Item i is a function of (seed, offset + i) only, so every rank and worker sees the same item."""

    def __init__(self, length: int, num_classes: int, channels: int, image_size: int, seed: int = 0,
                 offset: int = 0):
        self.length = int(length)
        self.num_classes = int(num_classes)
        self.shape = (int(channels), int(image_size), int(image_size))
        self.seed = int(seed)
        # Val uses offset = len(train) so its items never coincide with training items.
        self.offset = int(offset)
        # A weak per-class, per-channel offset makes the labels learnable, so smoke runs show loss going down.
        g = torch.Generator().manual_seed(self.seed * _SEED_STRIDE - 1)
        self.class_means = (_SIGNAL * torch.randn(self.num_classes, int(channels), 1, 1, generator=g,
                                                    dtype=torch.float32))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} synthetic samples")
        g = torch.Generator().manual_seed(self.seed * _SEED_STRIDE + self.offset + index)
        y = int(torch.randint(self.num_classes, (), generator=g))
        x = torch.randn(self.shape, generator=g, dtype=torch.float32)  # whatever the default dtype (fp64 runs)
        x += self.class_means[y]
        return x, y


def build_synthetic(*, image_size: int | None, seed: int, samples: int, classes: int, channels: int):
    """(train, val, image_size) for spec "synthetic": samples train items, samples // 4 val items."""
    size = DEFAULT_SYNTHETIC_SIZE if image_size is None else int(image_size)
    train = SyntheticDataset(samples, classes, channels, size, seed=seed, offset=0)
    val = SyntheticDataset(samples // 4, classes, channels, size, seed=seed, offset=samples)
    return train, val, size
