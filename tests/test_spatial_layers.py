"""Tiled layers (comm/spatial/layers.py) on 2 and 4 gloo ranks against one process on the whole image, float64:
the output, the input's gradient and the weights' gradients (summed over the tiles) are the whole image's, and
BatchNorm's running statistics are; so is a small residual front gathered into a tail."""

from __future__ import annotations

import copy

import pytest
from multirank import group

GRIDS = {"1x2": (1, 2), "2x1": (2, 1), "2x2": (2, 2)}


def _layers(channels: int):
    """(name, module, relu first) for every kind of tiled layer: convs of kernels 1-7 and strides 1-2, grouped
    (depthwise) or not, with or without bias; pools (max on a ReLU'd input: ties); BatchNorm."""
    from torch import nn

    cases = [(f"conv k{k} s{s} g{g} b{int(b)}", nn.Conv2d(channels, 2 * channels if g == 1 else channels, k, s, k // 2,
                                                          groups=g, bias=b), False)
             for k in (1, 3, 5, 7) for s in (1, 2) for g, b in ((1, True), (channels, False))]
    cases += [("conv same", nn.Conv2d(channels, channels, 3, padding="same"), False),
              ("maxpool 3/2/1", nn.MaxPool2d(3, 2, 1), True), ("maxpool 2/2/0", nn.MaxPool2d(2), True),
              ("avgpool 3/2/1", nn.AvgPool2d(3, 2, 1), False), ("avgpool 2", nn.AvgPool2d(2), False),
              ("batchnorm", nn.BatchNorm2d(channels), False),
              ("batchnorm cumulative", nn.BatchNorm2d(channels, momentum=None), False)]
    return cases


def _relative(a, b) -> float:
    scale = max(float(b.abs().max()), 1e-300)
    return float((a - b).abs().max()) / scale


def _step_errors(whole, mine, x, tiles, g) -> list[float]:
    """One forward and backward of `whole` on the image x and of `mine` on this rank's tile of it, with the same
    weighted loss: relative errors of the output, the input's gradient and each weight's gradient (summed over the
    tiles); the gradients are cleared after."""
    import torch
    import torch.distributed as dist

    full_x = x.clone().requires_grad_()
    out = whole(full_x)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    rows, cols = tiles.grid.split(x.shape[2], x.shape[3], tiles.index)
    tile_x = x[:, :, rows, cols].clone().requires_grad_()
    tile_out = mine(tile_x)
    out_rows, out_cols = tiles.grid.split(out.shape[2], out.shape[3], tiles.index)
    (tile_out * weights[:, :, out_rows, out_cols]).sum().backward()
    errors = [_relative(tile_out, out[:, :, out_rows, out_cols].detach()),
              _relative(tile_x.grad, full_x.grad[:, :, rows, cols])]
    for p_whole, p_mine in zip(whole.parameters(), mine.parameters()):
        summed = p_mine.grad.clone()
        dist.all_reduce(summed, group=g)
        errors.append(_relative(summed, p_whole.grad))
        p_whole.grad = p_mine.grad = None
    return errors


def _compare_layers(rank: int, world: int, grid: tuple[int, int], sides: tuple[int, int]) -> dict[str, float]:
    import torch

    from scaletrain.comm.spatial.geometry import TileGrid
    from scaletrain.comm.spatial.halo import Tiles
    from scaletrain.comm.spatial.layers import tiled

    worst: dict[str, float] = {}
    with group() as g:
        tiles = Tiles(TileGrid(*grid), rank, tuple(range(world)), g)
        torch.manual_seed(0)
        for name, layer, relu in _layers(4):
            layer = layer.double()
            x = torch.randn(2, 4, *sides, dtype=torch.float64)
            if relu:
                x = x.relu()
            whole = copy.deepcopy(layer)
            mine = tiled(name, copy.deepcopy(layer), tiles)
            errors = _step_errors(whole, mine, x, tiles, g)
            rows, cols = tiles.grid.split(x.shape[2], x.shape[3], rank)
            for b_whole, b_mine in zip(whole.buffers(), mine.buffers()):
                errors.append(_relative(b_mine.double(), b_whole.double()))
            if isinstance(layer, torch.nn.BatchNorm2d):  # evaluation: the running statistics, tile by tile
                whole.eval(), mine.eval()
                errors.append(_relative(mine(x[:, :, rows, cols]), whole(x)[:, :, rows, cols]))
            worst[name] = max(errors)
    return worst


@pytest.mark.parametrize("grid, sides", [("1x2", (9, 12)), ("2x1", (12, 7)), ("2x2", (12, 20))])
def test_every_tiled_layer_equals_the_whole_image(ranks, grid, sides):
    # odd sides along the dimension the grid does not cut; a tile of 3 rows meets the 7x7 kernel's halo of 3
    r, c = GRIDS[grid]
    results = ranks.run(_compare_layers, r * c, (r, c), sides)
    for rank, worst in enumerate(results):
        assert len(worst) == len(_layers(4))
        bad = {name: e for name, e in worst.items() if e > 1e-10}
        assert not bad, (rank, bad)


def _compare_stem(rank: int, world: int, grid: tuple[int, int], sides: tuple[int, int]) -> float:
    """Convolution 7x7/2, BatchNorm, ReLU and max pooling 3/2 fused (comm/spatial/stem.py) against the four layers on
    the whole image: output, input gradient, every weight's gradient (summed over the tiles), running statistics,
    two training steps (the second shifted by the first's running mean) and evaluation."""
    import torch
    from torch import nn

    from scaletrain.comm.spatial.geometry import TileGrid
    from scaletrain.comm.spatial.halo import Tiles
    from scaletrain.comm.spatial.layers import tiled

    with group() as g:
        tiles = Tiles(TileGrid(*grid), rank, tuple(range(world)), g)
        torch.manual_seed(0)
        whole = nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                              nn.MaxPool2d(3, 2, 1)).double()
        nn.init.normal_(whole[1].weight), nn.init.normal_(whole[1].bias)
        copy_ = copy.deepcopy(whole)
        conv, bn, pool = (tiled(str(i), copy_[i], tiles) for i in (0, 1, 3))
        conv.fuse(bn, pool)
        mine = nn.Sequential(conv, bn, nn.Identity(), pool)
        errors = []
        for _ in range(2):
            x = torch.randn(2, 3, *sides, dtype=torch.float64)
            errors += _step_errors(whole, mine, x, tiles, g)
            errors += [_relative(b_mine.double(), b_whole.double())
                       for b_whole, b_mine in zip(whole.buffers(), mine.buffers())]
        whole.eval(), mine.eval()
        out = whole(x)
        rows, cols = tiles.grid.split(x.shape[2], x.shape[3], rank)
        out_rows, out_cols = tiles.grid.split(out.shape[2], out.shape[3], rank)
        errors.append(_relative(mine(x[:, :, rows, cols]), out[:, :, out_rows, out_cols]))
    return max(errors)


@pytest.mark.parametrize("grid, sides", [("1x2", (10, 16)), ("2x1", (16, 9)), ("2x2", (16, 24))])
def test_a_fused_stem_equals_its_four_layers_on_the_whole_image(ranks, grid, sides):
    r, c = GRIDS[grid]
    assert max(ranks.run(_compare_stem, r * c, (r, c), sides)) < 1e-10
