"""A dataset slowed down on purpose (--inject data=S), to show what an input-bound run looks like."""

from __future__ import annotations

import time
from typing import Any

from torch.utils.data import Dataset


class DelayedDataset(Dataset):
    """Sleeps `seconds` before every sample, in whichever process loads it (so workers parallelise it)."""

    def __init__(self, inner: Dataset, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        time.sleep(self.seconds)
        return self.inner[index]
