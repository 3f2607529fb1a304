"""Layers that run on one tile of an image and give exactly that tile's part of the whole image's result.

Each is made from the ordinary layer it replaces and shares its Parameters and buffers (an optimizer, a
checkpoint and the parameter digests see the same tensors under the same names):

    SpatialConv2d       the halo its window needs (zeros at the image's edge), then the convolution unpadded
    SpatialMaxPool2d    the same with -inf at the edge (zeros would take the gradient of a tied zero)
    SpatialAvgPool2d    the same with zeros, every window counting k x k (count_include_pad=True)
    SpatialBatchNorm2d  statistics of the whole image: sums, sums of squares and counts all-reduced over the
                        tiles in forward, the matching two sums in backward (torch's SyncBatchNorm kernels have
                        no CPU version); the weight's and bias's gradients stay this tile's, summed later with
                        the other front parameters'

A weight's gradient on one rank is its tile's part: summed over the tiles it is the whole image's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from scaletrain.comm.spatial.geometry import Window, check_side, halo, why_not_tiled
from scaletrain.comm.spatial.halo import H, Halo, Tiles, bands, halo_op
from scaletrain.comm.spatial.stem import StemFn
from scaletrain.errors import UserError


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def windows_of(name: str, module: nn.Module) -> tuple[Window, Window]:
    """A conv's or pool's window along height and width; one line naming the layer when tiles cannot run it."""
    if isinstance(module, nn.Conv2d):
        if module.padding_mode != "zeros":
            raise UserError(f"layer {name} pads with {module.padding_mode!r}: tiles run zero padding only; end the "
                            "tiled front before it (--spatial-until)")
        padding = module.padding
        if isinstance(padding, str):  # "same" at stride 1 (torch allows no other); "valid" is 0
            padding = tuple(k // 2 for k in module.kernel_size) if padding == "same" else (0, 0)
        parts = zip(module.kernel_size, module.stride, padding, module.dilation)
    elif isinstance(module, (nn.MaxPool2d, nn.AvgPool2d)):
        if getattr(module, "ceil_mode", False):
            raise UserError(f"layer {name} rounds its output up (ceil_mode): tiles cannot; end the tiled front "
                            "before it (--spatial-until)")
        if isinstance(module, nn.AvgPool2d) and (not module.count_include_pad or module.divisor_override):
            raise UserError(f"layer {name} averages over the pixels inside the image only: tiles count the whole "
                            "window (count_include_pad=True); end the tiled front before it (--spatial-until)")
        dilation = _pair(getattr(module, "dilation", 1))
        parts = zip(_pair(module.kernel_size), _pair(module.stride or module.kernel_size), _pair(module.padding),
                    dilation)
    else:
        raise UserError(f"layer {name} ({type(module).__name__}) has no tiled version")
    out = tuple(Window(k, s, p, d) for k, s, p, d in parts)
    for w in out:
        why = why_not_tiled(w)
        if why is not None:
            raise UserError(f"layer {name} cannot run on tiles: {why}; end the tiled front before it "
                            "(--spatial-until)")
    return out[0], out[1]


class _Windowed(nn.Module):
    """A window layer on a tile: its halos, then the layer without padding."""

    fill = 0.0

    def __init__(self, name: str, module: nn.Module, tiles: Tiles) -> None:
        super().__init__()
        self.windows = windows_of(name, module)
        self.name, self.tiles = name, tiles
        # along a dimension the grid does not cut, no halo: the layer pads as it would (any length)
        self.cut = (tiles.grid.rows > 1, tiles.grid.cols > 1)
        self.widths: Halo = tuple(halo(w) if cut else (0, 0)  # type: ignore[assignment]
                                  for w, cut in zip(self.windows, self.cut))
        self.padding = tuple(0 if cut else w.padding for w, cut in zip(self.windows, self.cut))

    def run(self, x: torch.Tensor, op, *params) -> torch.Tensor:
        """`op` on the tile padded with its halos (or the fill at the image's edge)."""
        self.check(x)
        return halo_op(x, self.tiles, self.widths, self.fill, op, *params)

    def check(self, x: torch.Tensor) -> None:
        """One line naming the layer when the tile is too short for its halos."""
        for side, window, cut, what in zip(x.shape[H:], self.windows, self.cut, ("height", "width")):
            if cut:
                check_side(self.name, window, side, what)

    def extra_repr(self) -> str:
        grid = self.tiles.grid
        return f"{self.name}, tile {self.tiles.index} of {grid.rows}x{grid.cols}, halo {self.widths}"


class ConvOp:
    """A convolution without padding, its backward through aten's own (no forward computed again)."""

    def __init__(self, stride: tuple[int, int], padding: tuple[int, int], groups: int) -> None:
        self.stride, self.padding, self.groups = stride, padding, groups

    def forward(self, padded: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.conv2d(padded, weight, bias, self.stride, self.padding, 1, self.groups)

    def backward(self, g, padded, weight, bias, needs) -> tuple:
        """needs: (the input's gradient, the weight's, the bias's) wanted; `padded()` makes the padded tile."""
        dt = g.dtype  # under autocast the forward ran in g's precision
        x = padded()
        gi, gw, gb = torch.ops.aten.convolution_backward(
            g, x.to(dt), weight.to(dt), None if bias is None else [bias.shape[0]], list(self.stride),
            list(self.padding), [1, 1], False, [0, 0], self.groups,
            [bool(needs[0]), bool(needs[1]), bias is not None and bool(needs[2])])
        return (None if gi is None else gi.to(x.dtype), None if gw is None else gw.to(weight.dtype),
                None if gb is None else gb.to(bias.dtype))


class PoolOp:
    """A pooling without padding; backward computes its (cheap) forward again rather than keep its indices."""

    def __init__(self, fn, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int]) -> None:
        self.fn, self.kernel, self.stride, self.padding = fn, kernel, stride, padding

    def forward(self, padded: torch.Tensor) -> torch.Tensor:
        return self.fn(padded, self.kernel, self.stride, self.padding)

    def backward(self, g, padded, needs) -> tuple:
        if not needs[0]:
            return (None,)
        with torch.enable_grad():
            p = padded().detach().requires_grad_()
            return torch.autograd.grad(self.forward(p), p, g)


class MaxPoolOp(PoolOp):
    """Max pooling's backward from the window maxima's positions alone: the padded tile is made again for them and
    let go before the gradient (a tile-sized tensor of its own) is made, which then takes each output's gradient
    at its maximum's place (added where windows overlap, in the order of the outputs, as aten's kernel does)."""

    def backward(self, g, padded, needs) -> tuple:
        if not needs[0]:
            return (None,)
        x = padded()
        shape, dtype = x.shape, x.dtype
        with torch.no_grad():
            _, where = F.max_pool2d(x, self.kernel, self.stride, self.padding, return_indices=True)
        del x
        n, c = shape[0], shape[1]
        out = torch.zeros(shape, dtype=g.dtype, device=g.device)
        out.view(n, c, -1).scatter_add_(2, where.view(n, c, -1), g.reshape(n, c, -1))
        return (out.to(dtype),)


class SpatialConv2d(_Windowed):
    def __init__(self, name: str, conv: nn.Conv2d, tiles: Tiles) -> None:
        super().__init__(name, conv, tiles)
        self.weight = conv.weight
        self.bias = conv.bias
        self.op = ConvOp(conv.stride, self.padding, conv.groups)
        self.stem: tuple = ()  # (BatchNorm, max pooling) it runs with, fused (comm/spatial/stem.py); a tuple: not
        # registered again as submodules

    def fuse(self, bn: "SpatialBatchNorm2d", pool: "SpatialMaxPool2d") -> None:
        """Run this convolution, `bn`, a ReLU and `pool` as one (comm/spatial/stem.py); they pass their input on."""
        self.stem = (bn, pool)
        bn.fused = pool.fused = True

    @property
    def conv(self) -> "SpatialConv2d":
        return self

    @property
    def bn(self) -> "SpatialBatchNorm2d":
        return self.stem[0]

    @property
    def pool(self) -> "SpatialMaxPool2d":
        return self.stem[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.stem:
            return self.run(x, self.op, self.weight, self.bias)
        bn, pool = self.stem
        # evaluation, or under autocast (whose precision the fused backward would not keep): the four layers one by
        # one
        if (not bn.training and bn.running_mean is not None) or torch.is_autocast_enabled(x.device.type):
            return pool.run(F.relu(bn.normalise(self.run(x, self.op, self.weight, self.bias))), pool.op)
        self.check(x)
        return StemFn.apply(x, self.weight, self.bias, bn.weight, bn.bias, self)


class _SpatialPool(_Windowed):
    pool = staticmethod(F.max_pool2d)
    kind = MaxPoolOp

    def __init__(self, name: str, module: nn.Module, tiles: Tiles) -> None:
        super().__init__(name, module, tiles)
        self.op = self.kind(self.pool, tuple(w.kernel for w in self.windows), tuple(w.stride for w in self.windows),
                            self.padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x, self.op)


class SpatialMaxPool2d(_SpatialPool):
    fill = float("-inf")
    fused = False  # a fused stem's convolution runs it (comm/spatial/stem.py): it passes its input on

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.fused else self.run(x, self.op)


class SpatialAvgPool2d(_SpatialPool):
    pool = staticmethod(F.avg_pool2d)
    kind = PoolOp


def _sum_over_tiles(t: torch.Tensor, tiles: Tiles) -> torch.Tensor:
    if tiles.grid.tiles > 1:
        dist.all_reduce(t, group=tiles.group)
    return t


class _WholeImageNorm(torch.autograd.Function):
    """y = weight x_hat + bias with x_hat = (x - mean) invstd, mean and invstd those of the whole image; backward
    all-reduces sum(dy) and sum(dy x_hat) to give dx, and returns this tile's own parts of d weight, d bias."""

    @staticmethod
    def forward(ctx, x, weight, bias, mean, invstd, count: int, tiles: Tiles):
        shape = (1, -1, 1, 1)
        # in place where it can be: every tile-sized temporary here is as large as a layer's activations
        x_hat = torch.sub(x, mean.view(shape).to(x.dtype)).mul_(invstd.view(shape).to(x.dtype))
        ctx.save_for_backward(x_hat, weight, invstd)
        ctx.count, ctx.tiles, ctx.has_bias = count, tiles, bias is not None
        if weight is None:
            return x_hat.clone() if bias is None else x_hat + bias.view(shape)
        if bias is None:
            return x_hat * weight.view(shape)
        return torch.addcmul(bias.view(shape), x_hat, weight.view(shape))

    @staticmethod
    def backward(ctx, dy):
        x_hat, weight, invstd = ctx.saved_tensors
        # dx in x_hat's own memory (its last use; a second backward through this graph is refused by autograd's
        # check of saved tensors, not computed wrong): no third tile-sized tensor beside dy and x_hat
        d_weight, d_bias, dx = norm_backward(dy, x_hat, weight, invstd, ctx.count, ctx.tiles, weight is not None,
                                             ctx.has_bias)
        return dx, d_weight, d_bias, None, None, None, None


def norm_backward(dy: torch.Tensor, x_hat: torch.Tensor, weight, invstd: torch.Tensor, count: int, tiles: Tiles,
                  want_weight: bool, want_bias: bool) -> tuple:
    """(d weight, d bias, dx) of y = weight x_hat + bias over the whole image held as tiles: sum(dy) and
    sum(dy x_hat) all-reduced over the tiles; dx is written into x_hat's memory."""
    dims = (0, 2, 3)
    sum_dy = dy.sum(dims)
    sum_dy_xhat = _sum_of_products(dy, x_hat)
    d_weight = sum_dy_xhat.clone() if want_weight and weight is not None else None
    d_bias = sum_dy.clone() if want_bias else None
    sums = _sum_over_tiles(torch.stack([sum_dy, sum_dy_xhat]), tiles) / count
    shape = (1, -1, 1, 1)
    scale = invstd.to(dy.dtype) if weight is None else weight * invstd.to(dy.dtype)
    dx = x_hat.mul_(sums[1].view(shape).neg()).add_(dy).sub_(sums[0].view(shape)).mul_(scale.view(shape))
    return d_weight, d_bias, dx


def _sum_of_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum(a * b) over all dimensions but channels (1) of two NCHW tensors, a band of rows at a time: the product
    of whole tiles would be a temporary as large as a layer's activations."""
    return sum((x * y).sum((0, 2, 3)) for x, y in zip(bands(a), bands(b)))


class SpatialBatchNorm2d(nn.Module):
    """nn.BatchNorm2d over the whole image held as tiles (its statistics over the batch and every tile)."""

    def __init__(self, name: str, bn: nn.BatchNorm2d, tiles: Tiles) -> None:
        super().__init__()
        self.name, self.tiles = name, tiles
        self.weight, self.bias = bn.weight, bn.bias
        self.eps, self.momentum, self.track_running_stats = bn.eps, bn.momentum, bn.track_running_stats
        self.fused = False
        for buffer in ("running_mean", "running_var", "num_batches_tracked"):
            self.register_buffer(buffer, getattr(bn, buffer))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:  # a fused stem's convolution ran it (comm/spatial/stem.py)
            return x
        return self.normalise(x)

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training and self.running_mean is not None:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        mean, invstd, count = self.statistics(x)
        return _WholeImageNorm.apply(x, self.weight, self.bias, mean, invstd, count, self.tiles)

    def statistics(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(mean, 1 / std, count) of the whole image's values per channel, the running statistics tracked."""
        # in float32 at least, shifted by a value every tile shares so that the sum of squares does not cancel:
        # the running mean (zero before the first step); a band of rows at a time (no tile-sized temporary)
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        with torch.no_grad():
            shift = (self.running_mean if self.running_mean is not None else x.new_zeros(x.size(1))).to(acc)
            c = x.size(1)
            local = torch.zeros(2 * c, dtype=acc, device=x.device)
            for band in bands(x.detach()):
                centred = torch.sub(band.to(acc), shift.view(1, -1, 1, 1))
                local[:c] += centred.sum((0, 2, 3))
                local[c:] += centred.square_().sum((0, 2, 3))
            total = _sum_over_tiles(local, self.tiles)
            count = x.size(0) * x.size(2) * x.size(3) * self.tiles.grid.tiles  # tiles are equal: no device sync
            mean_shifted = total[:c] / count
            var = (total[c:2 * c] / count - mean_shifted.square()).clamp_min(0)
            mean = shift + mean_shifted
            invstd = (var + self.eps).rsqrt()
            self._track(mean, var, count)
        return mean, invstd, count

    def backward_in_place(self, dy: torch.Tensor, x_hat: torch.Tensor, weight, invstd: torch.Tensor,
                          want_weight: bool, want_bias: bool) -> tuple:
        """norm_backward for a tile of this layer's input shape (the fused stem's)."""
        count = x_hat.size(0) * x_hat.size(2) * x_hat.size(3) * self.tiles.grid.tiles
        return norm_backward(dy, x_hat, weight, invstd, count, self.tiles, want_weight, want_bias)

    def _track(self, mean: torch.Tensor, var: torch.Tensor, count: int) -> None:
        """The running statistics as nn.BatchNorm2d keeps them (the variance unbiased over the whole count)."""
        if not self.track_running_stats or self.running_mean is None:
            return
        self.num_batches_tracked.add_(1)
        m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        unbiased = var * count / max(count - 1, 1)
        self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype), alpha=m)
        self.running_var.mul_(1 - m).add_(unbiased.to(self.running_var.dtype), alpha=m)

    def extra_repr(self) -> str:
        return f"{self.name}, statistics over {self.tiles.grid.tiles} tiles"


SPATIAL = {nn.Conv2d: SpatialConv2d, nn.MaxPool2d: SpatialMaxPool2d, nn.AvgPool2d: SpatialAvgPool2d,
           nn.BatchNorm2d: SpatialBatchNorm2d}
"""The tiled version of each layer a tiled front may hold besides pointwise ones."""

POINTWISE = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Hardswish, nn.Identity,
             nn.Dropout)
"""Layers that act on each pixel alone: they run on a tile unchanged (Dropout: each tile draws its own mask)."""


def tiled(name: str, module: nn.Module, tiles: Tiles) -> nn.Module:
    """The tiled version of a leaf layer (sharing its tensors), the layer itself if pointwise, or one line naming
    a layer that has none."""
    if isinstance(module, POINTWISE):
        return module
    make = SPATIAL.get(type(module))
    if make is None:
        raise UserError(f"layer {name} ({type(module).__name__}) cannot run on tiles: end the tiled front before it "
                        "(--spatial-until)")
    return make(name, module, tiles)
