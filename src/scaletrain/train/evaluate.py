"""Validation sharded across ranks with counts summed, so the result equals a single-process evaluation."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Sampler

from scaletrain.distributed.group import all_reduce_max, all_reduce_sum
from scaletrain.perf.precision import to_device


class ShardSampler(Sampler[int]):
    """Rank r takes items r, r+W, r+2W, ...: every item exactly once over all ranks, no padding.

    (DistributedSampler pads with repeated items so all ranks get equal counts, which would
    count some validation images twice.)
    """

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        self.indices = range(rank, length, world_size)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


@dataclass(frozen=True)
class EvalResult:
    top1: float
    top5: float
    loss: float
    samples: int


class Tally:
    """Correct top-1 and top-k, samples and summed loss of the batches seen here; `result` sums them over
    every rank (collective): ranks that saw none add zeros."""

    def __init__(self, device: torch.device, num_classes: int) -> None:
        self.k = min(5, num_classes)
        # [correct top-1, correct top-k, samples, summed loss]: float64 keeps the loss sum exact enough
        self.totals = torch.zeros(4, dtype=torch.float64, device=device)

    def add(self, logits: torch.Tensor, y: torch.Tensor) -> None:
        logits = logits.to(torch.get_default_dtype())  # autocast's 16 bits up to float32 (float64 under fp64)
        hits = logits.topk(self.k, dim=1).indices.eq(y[:, None])
        self.totals[0] += hits[:, 0].sum()
        self.totals[1] += hits.any(dim=1).sum()
        self.totals[2] += len(y)
        self.totals[3] += torch.nn.functional.cross_entropy(logits, y, reduction="sum")

    def result(self) -> EvalResult:
        all_reduce_sum(self.totals)
        correct1, correctk, n, loss = self.totals.tolist()  # note: a CPU-GPU sync point, once per evaluation
        if n == 0:
            raise RuntimeError("the validation split is empty")
        return EvalResult(top1=correct1 / n, top5=correctk / n, loss=loss / n, samples=int(n))


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader, device: torch.device, autocast_dtype: torch.dtype | None,
             num_classes: int, lockstep: bool = False) -> EvalResult:
    """Top-1/top-5 accuracy and mean loss over the whole validation split (all ranks together).

    lockstep: every rank runs as many forwards as the rank with the most batches (a sharded model's
    forward is collective): the others run the missing ones on an empty batch."""
    was_training = model.training
    model.eval()
    tally = Tally(device, num_classes)
    batches = iter(loader)
    if lockstep:
        most = torch.tensor([len(loader)], device=device)
        all_reduce_max(most)
        batches = _padded(batches, int(most.item()), tuple(loader.dataset[0][0].shape))
    for x, y, _bad in batches:
        if len(y) == 0 and not lockstep:
            continue
        x, y = to_device(x, device), to_device(y, device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = model(x)
        if len(y):
            tally.add(logits, y)
    model.train(was_training)
    return tally.result()


def _padded(batches, count: int, sample_shape: tuple[int, ...]):
    """`batches`, then empty batches of samples of `sample_shape` until `count` in all."""
    n = 0
    for batch in batches:
        n += 1
        yield batch
    for _ in range(count - n):
        yield torch.zeros((0, *sample_shape)), torch.zeros(0, dtype=torch.long), []

