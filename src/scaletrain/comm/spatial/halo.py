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

import contextlib
from dataclasses import dataclass, field
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
    sent: list[int] = field(default_factory=lambda: [0], compare=False)
    """Bytes this rank has sent its neighbours in halos and their gradients (a running count)."""
    profiler: list[Any] = field(default_factory=lambda: [None], compare=False)
    """The step profiler while a training step runs: its exchanges are the step's `halo` and `gather` phases."""

    @contextlib.contextmanager
    def training_step(self, prof, trained: dict[str, int], samples: int):
        """A training step's halos and gather as the profiler's phases (not evaluation's), its halo bytes, samples
        and the step counted in `trained`."""
        sent = self.sent[0]
        self.profiler[0] = prof
        try:
            yield
        finally:
            self.profiler[0] = None
        trained["halo_bytes"] += self.sent[0] - sent
        trained["samples"] += samples
        trained["steps"] += 1

    def carve(self, phase: str) -> contextlib.AbstractContextManager:
        prof = self.profiler[0]
        return contextlib.nullcontext() if prof is None else prof.carve(phase)

    def peers(self, dim: int) -> tuple[int | None, int | None]:
        """The global ranks before and after this tile along grid dimension `dim` (None at the image's edge)."""
        before, after = self.grid.neighbours(self.index, dim)
        return (None if before is None else self.ranks[before]), (None if after is None else self.ranks[after])


Halo = tuple[tuple[int, int], tuple[int, int]]
"""(before, after) for rows, then for columns."""


def _swap(sends: list[tuple[int, torch.Tensor]], receives: list[tuple[int, torch.Tensor]], tiles: Tiles) -> None:
    """Post every send and receive of one phase together and wait for all of them (gloo needs contiguous
    buffers on both sides: the caller gives them)."""
    group = tiles.group
    tiles.sent[0] += sum(t.numel() * t.element_size() for _, t in sends)
    ops = ([dist.P2POp(dist.isend, t, peer, group) for peer, t in sends]
           + [dist.P2POp(dist.irecv, t, peer, group) for peer, t in receives])
    if ops:
        with tiles.carve("halo"):
            for work in dist.batch_isend_irecv(ops):
                work.wait()


def _rows(x: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    return x.narrow(dim, start, length).contiguous()


def _strips(x: torch.Tensor, dim: int, before: int, after: int, fill: float,
            tiles: Tiles) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The `before` rows of the previous tile (or the fill) and the `after` rows of the next one (None: none)."""
    prev, nxt = tiles.peers(dim - H)
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
    _swap(sends, receives, tiles)
    if top is None and before:
        top = buffer(before).fill_(fill)
    if bottom is None and after:
        bottom = buffer(after).fill_(fill)
    return top, bottom


def _join(x: torch.Tensor, dim: int, top: torch.Tensor | None, bottom: torch.Tensor | None) -> torch.Tensor:
    return torch.cat([t for t in (top, x, bottom) if t is not None], dim) if top is not None or bottom is not None \
        else x


def _unpad(g: torch.Tensor, dim: int, before: int, after: int, tiles: Tiles) -> torch.Tensor:
    """The adjoint of padding with _strips: the tile's own rows of g, plus the gradients its neighbours' halos
    received for its border rows; the gradient of the fill is dropped. g is this backward's own (the layer's
    gradient, just made): the neighbours' parts are added to it in place and the tile's rows come back as a view,
    not a copy, of it (a tile-sized copy here would be the largest tensor of the front's backward)."""
    prev, nxt = tiles.peers(dim - H)
    n = g.size(dim) - before - after
    inner = g.narrow(dim, before, n)
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
    _swap(sends, receives, tiles)
    if from_prev is not None:
        inner.narrow(dim, 0, after).add_(from_prev)
    if from_next is not None:
        inner.narrow(dim, n - before, before).add_(from_next)
    return inner


def bands(x: torch.Tensor, chunk_bytes: int = 2**23):
    """Row bands of an NCHW tensor (views), each about `chunk_bytes`: an element-wise pass over a tile's channels a
    band at a time makes temporaries of that size, not of the tile's."""
    rows = max(1, chunk_bytes // max(1, x[:, :, :1].numel() * x.element_size()))
    for r in range(0, x.size(H), rows):
        yield x.narrow(H, r, min(rows, x.size(H) - r))


def pad(x: torch.Tensor, tiles: Tiles, widths: Halo, fill: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """x padded with its halos (rows, then columns of the row-padded tile) and the strips that came in, in order."""
    padded, strips = x, []
    for dim, (before, after) in zip((H, W), widths):
        pair = _strips(padded, dim, before, after, fill, tiles)
        strips += [t for t in pair if t is not None]
        padded = _join(padded, dim, *pair)
    return padded, strips


def padded_again(x: torch.Tensor, strips: list[torch.Tensor], widths: Halo) -> torch.Tensor:
    """The padded tile made again from x and the strips `pad` returned (no exchange)."""
    rest = iter(strips)
    for dim, (before, after) in zip((H, W), widths):
        x = _join(x, dim, next(rest) if before else None, next(rest) if after else None)
    return x


def unpadded(g: torch.Tensor, widths: Halo, tiles: Tiles) -> torch.Tensor:
    """The adjoint of `pad`: columns, then rows (_unpad), the halos' gradients sent back to their owners."""
    for dim, (before, after) in reversed(list(zip((H, W), widths))):
        g = _unpad(g, dim, before, after, tiles)
    return g


class HaloOp(torch.autograd.Function):
    """`op` (a window layer: conv, pool) on the tile padded with its halos, keeping for backward only the tile and
    its halo strips, not the padded copy: the layer before keeps the tile already, and a second, padded copy of
    every tiled layer's input would take as much memory as the whole image's activations. Backward gives `op` a
    way to rebuild the padded tile (`op.backward(g, padded, *params, needs)`: padded() makes it; the op keeps it
    no longer than it needs it), and returns the halos' gradients to their owners."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tiles: Tiles, widths: Halo, fill: float, op, *params):
        padded, strips = pad(x, tiles, widths, fill)
        ctx.tiles, ctx.widths, ctx.op = tiles, widths, op
        ctx.save_for_backward(x, *strips, *params)
        ctx.params = len(params)
        return op.forward(padded, *params)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        saved = list(ctx.saved_tensors)
        params = saved[len(saved) - ctx.params:] if ctx.params else []
        x, strips = saved[0], saved[1:len(saved) - ctx.params]
        # the input's gradient only where it is wanted: the first layer's input is the image (and then no halo
        # gradient is exchanged either: every tile runs the same layers, so all of them skip it alike)
        needs = ctx.needs_input_grad
        grads = ctx.op.backward(g, lambda: padded_again(x, strips, ctx.widths), *params,
                                needs=(needs[0], *needs[5:]))
        g_in = grads[0] if grads[0] is None else unpadded(grads[0], ctx.widths, ctx.tiles)
        return (g_in, None, None, None, None, *grads[1:])


def halo_op(x: torch.Tensor, tiles: Tiles, widths: Halo, fill: float, op, *params) -> torch.Tensor:
    """`op.forward(x padded with its halos, *params)`, differentiable in x and params (HaloOp); an op that
    needs no halo runs on the tile as it is."""
    if not any(widths[0]) and not any(widths[1]):
        return op.forward(x, *params)
    return HaloOp.apply(x, tiles, widths, fill, op, *params)


class GatherTiles(torch.autograd.Function):
    """Every tile of the group assembled into the whole image on every rank (what runs after the tiled front);
    backward keeps this tile's part of the gradient. (torch.distributed.nn's all_gather would sum the
    gradient over the group: each rank runs the rest of the model on the same image, so that counts it S times.)"""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tiles: Tiles) -> torch.Tensor:
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in tiles.ranks]
        with tiles.carve("gather"):
            dist.all_gather(parts, x, group=tiles.group)
            grid = tiles.grid
            rows = [torch.cat(parts[r * grid.cols:(r + 1) * grid.cols], W) for r in range(grid.rows)]
            whole = torch.cat(rows, H)
        ctx.tiles, ctx.tile = tiles, x.shape[H:]
        return whole

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (h, w), (r, c) = ctx.tile, ctx.tiles.grid.at(ctx.tiles.index)
        return g[:, :, r * h:(r + 1) * h, c * w:(c + 1) * w].contiguous(), None


def gather(x: torch.Tensor, tiles: Tiles) -> torch.Tensor:
    return x if tiles.grid.tiles == 1 else GatherTiles.apply(x, tiles)
