"""A tiled stem fused: convolution -> BatchNorm -> ReLU -> max pooling as one autograd function that keeps only the
convolution's input for backward and computes the rest again there (a checkpoint of its own, made to need little).

ResNet's stem runs at the image's full resolution (its convolution's output is 16 values per input pixel for
ResNet-18, where the image has 3) and is where a tile's rank peaks. Run as four layers, its backward holds the
BatchNorm's normalised input, the ReLU's output, the gradient coming back and the one ReLU's backward makes: four
tensors of the convolution's output size. Fused, its backward holds two (the normalised input, then the gradient
made in place of the pooling's: masked by the ReLU in place, turned into the convolution's output gradient in the
normalised input's memory) and the maxima's positions: the pooling's padded input is built with its halos in
place (no second copy) and let go once the positions are known. Its forward holds two as well (the convolution's
output normalised in place, the pooling's padded input). The statistics are the whole image's, as
SpatialBatchNorm2d takes them; the gradients are the same as the four layers' in any precision up to the order of
sums (float64: within 1e-10, tests/test_spatial_layers.py).

front.fused_stems finds the chains the model holds: four modules in a row, each output read by the next alone,
each module called once (a shared ReLU module is not fused).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from scaletrain.comm.spatial.halo import H, W, Tiles, _strips, bands, pad, padded_again, unpadded

def _channel(v: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    return None if v is None else v.to(like.dtype).view(1, -1, 1, 1)


def _affine_relu(x_hat: torch.Tensor, weight, bias, out: torch.Tensor) -> torch.Tensor:
    """out = relu(weight x_hat + bias), written into `out` (a view: the interior of the pooling's padded input)."""
    out.copy_(x_hat)
    if weight is not None:
        out.mul_(_channel(weight, out))
    if bias is not None:
        out.add_(_channel(bias, out))
    return out.relu_()


def _padded_pool_input(x_hat: torch.Tensor, weight, bias, pool) -> torch.Tensor:
    """relu(weight x_hat + bias) in the interior of a tensor that has room for the pooling's halos, which are then
    exchanged into it: rows, then columns of the row-padded tile (as halo.HaloOp pads), -inf at the image's edge."""
    (top_w, bottom_w), (left_w, right_w) = pool.widths
    n, c, h, w = x_hat.shape
    padded = x_hat.new_empty(n, c, h + top_w + bottom_w, w + left_w + right_w)
    inner = padded[:, :, top_w:top_w + h, left_w:left_w + w]
    _affine_relu(x_hat, weight, bias, inner)
    tiles: Tiles = pool.tiles
    if top_w or bottom_w:
        top, bottom = _strips(inner, H, top_w, bottom_w, pool.fill, tiles)
        if top is not None:
            padded[:, :, :top_w, left_w:left_w + w] = top
        if bottom is not None:
            padded[:, :, top_w + h:, left_w:left_w + w] = bottom
    if left_w or right_w:
        band = padded[:, :, :, left_w:left_w + w]
        left, right = _strips(band, W, left_w, right_w, pool.fill, tiles)
        if left is not None:
            padded[:, :, :, :left_w] = left
        if right is not None:
            padded[:, :, :, left_w + w:] = right
    return padded


def _pool(padded: torch.Tensor, pool, indices: bool = False):
    op = pool.op
    return F.max_pool2d(padded, op.kernel, op.stride, op.padding, return_indices=indices)


class StemFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, conv_weight, conv_bias, bn_weight, bn_bias, stem):
        conv, bn, pool = stem.conv, stem.bn, stem.pool
        padded, strips = pad(x, conv.tiles, conv.widths, conv.fill)
        z = conv.op.forward(padded, conv_weight, conv_bias)
        del padded
        mean, invstd, _ = bn.statistics(z)
        x_hat = z.sub_(_channel(mean, z)).mul_(_channel(invstd, z))
        out = _pool(_padded_pool_input(x_hat, bn_weight, bn_bias, pool), pool)
        ctx.stem, ctx.strips = stem, len(strips)
        ctx.save_for_backward(x, *strips, conv_weight, conv_bias, bn_weight, bn_bias, mean, invstd)
        return out

    @staticmethod
    def backward(ctx, g):
        stem = ctx.stem
        conv, bn, pool = stem.conv, stem.bn, stem.pool
        x, *rest = ctx.saved_tensors
        strips, (conv_weight, conv_bias, bn_weight, bn_bias, mean, invstd) = rest[:ctx.strips], rest[ctx.strips:]
        needs = ctx.needs_input_grad
        with torch.no_grad():
            # the forward again, to the maxima's positions (the convolution's halos were kept: no exchange)
            z = conv.op.forward(padded_again(x, strips, conv.widths), conv_weight, conv_bias)
            x_hat = z.sub_(_channel(mean, z)).mul_(_channel(invstd, z))
            padded = _padded_pool_input(x_hat, bn_weight, bn_bias, pool)
            shape = padded.shape
            _, where = _pool(padded, pool, indices=True)
            del padded
            # the pooling's gradient: each output's at its maximum's place, then the halos' back to their owners
            n, c = shape[0], shape[1]
            grad = torch.zeros(shape, dtype=g.dtype, device=g.device)
            grad.view(n, c, -1).scatter_add_(2, where.view(n, c, -1), g.reshape(n, c, -1))
            del where
            grad = unpadded(grad, pool.widths, pool.tiles)
            # through the ReLU, in place: zero where weight x_hat + bias <= 0
            w, b = _channel(bn_weight, x_hat), _channel(bn_bias, x_hat)
            for gy, xh in zip(bands(grad), bands(x_hat)):
                y = xh * w if w is not None else xh.clone()
                if b is not None:
                    y.add_(b)
                gy.masked_fill_(y <= 0, 0)
            del gy, xh, y  # (the loop's views would keep the gradient alive through the convolution's backward)
            # through the BatchNorm of the whole image (SpatialBatchNorm2d's backward): dz in x_hat's memory
            d_bn_weight, d_bn_bias, dz = bn.backward_in_place(grad, x_hat, bn_weight, invstd, needs[3], needs[4])
            del grad
            gx, d_conv_weight, d_conv_bias = conv.op.backward(
                dz, lambda: padded_again(x, strips, conv.widths), conv_weight, conv_bias, needs=(needs[0], *needs[1:3]))
        if gx is not None:
            gx = unpadded(gx, conv.widths, conv.tiles)
        return gx, d_conv_weight, d_conv_bias, d_bn_weight, d_bn_bias, None
