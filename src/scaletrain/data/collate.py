"""Batch assembly that tolerates undecodable samples instead of crashing the loader."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BadSample:
    """Stand-in returned by a dataset's __getitem__ when its file cannot be decoded."""

    path: str
    reason: str
    # The shape a good sample would have had, so an all-bad batch can still be shaped [0, C, H, W];
    # optional because callers outside the image datasets may not know it.
    shape: tuple[int, ...] = ()

    def describe(self) -> str:
        """The one-line "path: reason" form reported to the training loop."""
        return f"{self.path}: {self.reason}"


def collate(samples: list) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Stack (x, y) samples into float32 x [B,C,H,W] and int64 y [B], dropping and reporting BadSamples."""
    good_x: list[torch.Tensor] = []
    good_y: list[int] = []
    bad: list[str] = []
    trailing: tuple[int, ...] | None = None
    for sample in samples:
        if isinstance(sample, BadSample):
            bad.append(sample.describe())
            if trailing is None and sample.shape:
                trailing = tuple(sample.shape)
            continue
        x, y = sample
        good_x.append(x)
        good_y.append(int(y))
    if good_x:
        x = torch.stack(good_x).to(torch.float32)
        y = torch.tensor(good_y, dtype=torch.int64)
    else:
        # Keep the trailing shape so the loop can treat an all-bad batch like any other (size 0).
        x = torch.empty((0, *(trailing or ())), dtype=torch.float32)
        y = torch.empty((0,), dtype=torch.int64)
    return x, y, bad
