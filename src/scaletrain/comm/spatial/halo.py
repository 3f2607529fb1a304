"""The halo exchange, differentiable both ways: forward copies each neighbour's border rows (and columns, and so
corners) into a padded tile; backward sends each halo's gradient back to the tile that owns those pixels, where
it is added. On torch.distributed point-to-point ops of the tiles' process group (gloo on CPU, NCCL on GPU).

Forward is a linear map E (copy in the neighbours' borders, the fill at the image's true edge); backward is its
adjoint. A 2-D grid pads rows, then columns of the row-padded tile (the corner a diagonal neighbour owns arrives
through the side neighbour that received it first); backward undoes columns, then rows. Each phase carries at
most one message per direction between two tiles, and which messages exist follows from the geometry alone, so
both ends always agree (no tags, whose NCCL ignores, and no order to rely on). docs/design/spatial.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from scaletrain.comm.spatial.geometry import TileGrid

H, W = 2, 3  # an NCHW tensor's height and width dimensions: the grid's dimensions 0 and 1


@dataclass(frozen=True)
class Tiles:
    """This rank's place among the ranks that hold one image's tiles: the grid, its tile, the global rank of
    every tile, and the group they share."""

    grid: TileGrid
    index: int
    ranks: tuple[int, ...]
    group: Any = None

    def peers(self, dim: int) -> tuple[int | None, int | None]:
        """The global ranks before and after this tile along grid dimension `dim` (None at the image's edge)."""
        before, after = self.grid.neighbours(self.index, dim)
        return (None if before is None else self.ranks[before]), (None if after is None else self.ranks[after])


Halo = tuple[tuple[int, int], tuple[int, int]]
"""(before, after) for rows, then for columns."""


def _swap(sends: list[tuple[int, torch.Tensor]], receives: list[tuple[int, torch.Tensor]], group) -> None:
    """Post every send and receive of one phase together and wait for all of them (gloo needs contiguous
    buffers on both sides: the caller gives them)."""
    ops = ([dist.P2POp(dist.isend, t, peer, group) for peer, t in sends]
           + [dist.P2POp(dist.irecv, t, peer, group) for peer, t in receives])
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def _rows(x: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    return x.narrow(dim, start, length).contiguous()


def _pad(x: torch.Tensor, dim: int, before: int, after: int, peers: tuple[int | None, int | None], fill: float,
         group) -> torch.Tensor:
    """x with `before` rows of the previous tile (or the fill) above and `after` of the next one below."""
    prev, nxt = peers
    n = x.size(dim)
    sends, receives = [], []
    shape = list(x.shape)

    def buffer(rows: int) -> torch.Tensor:
        shape[dim] = rows
        return torch.empty(shape, dtype=x.dtype, device=x.device)

    top = bottom = None
    if prev is not None:
        if after:
            sends.append((prev, _rows(x, dim, 0, after)))  # my first rows are the previous tile's bottom halo
        if before:
            top = buffer(before)
            receives.append((prev, top))
    if nxt is not None:
        if before:
            sends.append((nxt, _rows(x, dim, n - before, before)))
        if after:
            bottom = buffer(after)
            receives.append((nxt, bottom))
    _swap(sends, receives, group)
    if top is None and before:
        top = buffer(before).fill_(fill)
    if bottom is None and after:
        bottom = buffer(after).fill_(fill)
    return torch.cat([t for t in (top, x, bottom) if t is not None], dim)


def _unpad(g: torch.Tensor, dim: int, before: int, after: int, peers: tuple[int | None, int | None],
           group) -> torch.Tensor:
    """The adjoint of _pad: the tile's own rows of g, plus the gradients its neighbours' halos received for its
    border rows; the gradient of the fill is dropped."""
    prev, nxt = peers
    n = g.size(dim) - before - after
    inner = _rows(g, dim, before, n).clone()
    sends, receives = [], []
    shape = list(g.shape)
    shape[dim] = after
    from_prev = torch.empty(shape, dtype=g.dtype, device=g.device) if prev is not None and after else None
    shape[dim] = before
    from_next = torch.empty(shape, dtype=g.dtype, device=g.device) if nxt is not None and before else None
    if prev is not None:
        if before:
            sends.append((prev, _rows(g, dim, 0, before)))
        if from_prev is not None:
            receives.append((prev, from_prev))
    if nxt is not None:
        if after:
            sends.append((nxt, _rows(g, dim, before + n, after)))
        if from_next is not None:
            receives.append((nxt, from_next))
    _swap(sends, receives, group)
    if from_prev is not None:
        inner.narrow(dim, 0, after).add_(from_prev)
    if from_next is not None:
        inner.narrow(dim, n - before, before).add_(from_next)
    return inner


class HaloExchange(torch.autograd.Function):
    """A tile padded with its neighbours' borders (rows, then columns); backward returns the halos' gradients to
    their owners."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tiles: Tiles, widths: Halo, fill: float) -> torch.Tensor:
        ctx.tiles, ctx.widths = tiles, widths
        for dim, (before, after) in zip((H, W), widths):
            x = _pad(x, dim, before, after, tiles.peers(dim - H), fill, tiles.group)
        return x

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        tiles = ctx.tiles
        for dim, (before, after) in reversed(list(zip((H, W), ctx.widths))):
            g = _unpad(g.contiguous(), dim, before, after, tiles.peers(dim - H), tiles.group)
        return g, None, None, None


def exchange(x: torch.Tensor, tiles: Tiles, widths: Halo, fill: float = 0.0) -> torch.Tensor:
    """The tile `x` (N, C, h, w) padded to (N, C, before + h + after, ...) from its neighbours (or `fill`)."""
    if not any(widths[0]) and not any(widths[1]):
        return x
    return HaloExchange.apply(x, tiles, widths, fill)


class GatherTiles(torch.autograd.Function):
    """Every tile of the group assembled into the whole image on every rank (what runs after the tiled front);
    backward keeps this tile's part of the gradient. (torch.distributed.nn's all_gather would sum the
    gradient over the group: each rank runs the rest of the model on the same image, so that counts it S times.)"""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tiles: Tiles) -> torch.Tensor:
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in tiles.ranks]
        dist.all_gather(parts, x, group=tiles.group)
        grid = tiles.grid
        rows = [torch.cat(parts[r * grid.cols:(r + 1) * grid.cols], W) for r in range(grid.rows)]
        ctx.tiles, ctx.tile = tiles, x.shape[H:]
        return torch.cat(rows, H)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (h, w), (r, c) = ctx.tile, ctx.tiles.grid.at(ctx.tiles.index)
        return g[:, :, r * h:(r + 1) * h, c * w:(c + 1) * w].contiguous(), None


def gather(x: torch.Tensor, tiles: Tiles) -> torch.Tensor:
    return x if tiles.grid.tiles == 1 else GatherTiles.apply(x, tiles)
