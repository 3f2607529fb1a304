"""The training sampler: DistributedSampler's order, which a run resumed mid-epoch enters part way."""

from __future__ import annotations

from torch.utils.data import DistributedSampler


class ResumableSampler(DistributedSampler):
    """This replica's share of each epoch in DistributedSampler's order (seeded per epoch, the same on
    every run), of which the first `skip` indices are left out: the samples a checkpoint written mid-epoch
    has already trained on. The loop sets `skip` for the epoch it resumes in, and 0 after it."""

    skip = 0

    def __iter__(self):
        it = super().__iter__()
        for _ in range(self.skip):
            next(it, None)
        return it

    def __len__(self) -> int:
        return super().__len__() - self.skip
