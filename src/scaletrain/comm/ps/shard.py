"""How the parameters are cut into server shards (pure functions; no torch).

The model's parameters, flattened and concatenated in `model.parameters()` order, form one vector of N
values. Server s holds the contiguous range [bounds[s], bounds[s+1]) of it, so the shards differ by at
most one value. A range may cut a parameter in two: each server keeps the pieces it holds as separate
tensors, each in the optimizer group of its parameter (weight decay or not), and because every optimizer
we offer updates each value on its own (SGD, momentum, Adagrad, AdamW), the sharded update is the same
arithmetic as the unsharded one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Piece:
    """Values [start, stop) of parameter `param` (flattened), and whether weight decay applies to it."""

    param: int
    start: int
    stop: int
    decay: bool

    @property
    def numel(self) -> int:
        return self.stop - self.start


def bounds(total: int, servers: int) -> list[int]:
    """Shard boundaries in the flat vector: servers + 1 offsets from 0 to total, as even as possible."""
    if servers < 1:
        raise ValueError("need at least one server")
    return [total * s // servers for s in range(servers + 1)]


def pieces(sizes: Sequence[int], decays: Sequence[bool], lo: int, hi: int) -> list[Piece]:
    """The parts of the parameters (of `sizes` values each) that fall in the flat range [lo, hi)."""
    out, offset = [], 0
    for i, (n, decay) in enumerate(zip(sizes, decays)):
        a, b = max(lo, offset), min(hi, offset + n)
        if a < b:
            out.append(Piece(i, a - offset, b - offset, decay))
        offset += n
    return out


def plan(sizes: Sequence[int], decays: Sequence[bool], servers: int) -> list[list[Piece]]:
    """Every server's pieces, in flat order; together they cover every value exactly once."""
    cuts = bounds(sum(sizes), servers)
    return [pieces(sizes, decays, cuts[s], cuts[s + 1]) for s in range(servers)]
