"""`bigdigits:SIZE` (data/bigdigits.py): a real digit on a large textured canvas, made on demand, the same in every
process; downsampled by averaging; bad specs refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scaletrain.data import build_datasets, default_image_size
from scaletrain.data.bigdigits import DIGIT, MEAN, STD
from scaletrain.data.digits import load_digits_split
from scaletrain.errors import UserError


def test_samples_are_the_digits_on_a_canvas_the_same_in_every_process():
    a, b = build_datasets("bigdigits:128"), build_datasets("bigdigits:128")
    assert a.num_classes == 10 and a.in_channels == 1 and a.image_size == 128 == default_image_size("bigdigits:128")
    x, y = a.train[5]
    assert x.shape == (1, 128, 128) and x.dtype == torch.float32
    assert torch.equal(x, b.train[5][0]) and torch.equal(x, a.train[5][0])  # made again: the same
    assert not torch.equal(x, a.train[6][0])
    train, val = load_digits_split()
    assert len(a.train) == len(train.labels) and len(a.val) == len(val.labels)
    assert [a.train[i][1] for i in range(20)] == list(train.labels[:20])


def test_the_digit_is_on_the_canvas():
    """The canvas holds the digit's ink: somewhere a DIGIT x DIGIT window matches the digit drawn at INK."""
    from scaletrain.data.bigdigits import DIGIT_SCALE, INK

    data = build_datasets("bigdigits:64").train
    canvas = data.canvas(3).numpy()
    digit = np.kron(data.images[3] / 16.0, np.ones((DIGIT_SCALE, DIGIT_SCALE))) * INK
    ink = digit > 1.5  # strokes brighter than any texture
    hits = [(y, x) for y in range(64 - DIGIT + 1) for x in range(64 - DIGIT + 1)
            if np.allclose(canvas[y:y + DIGIT, x:x + DIGIT][ink], digit[ink], atol=1e-5)]
    assert len(hits) == 1


def test_downsampling_averages_blocks():
    full, small = build_datasets("bigdigits:64"), build_datasets("bigdigits:64", image_size=8)
    x, y = full.train[2]
    s, y2 = small.train[2]
    assert s.shape == (1, 8, 8) and s.dtype == torch.float32 and y == y2 and small.image_size == 8
    assert torch.allclose(s, x.reshape(1, 8, 8, 8, 8).mean(dim=(2, 4)), atol=1e-6)
    odd = build_datasets("bigdigits:64", image_size=24)  # not a divisor: overlapping blocks, still their means
    assert odd.val[0][0].shape == (1, 24, 24) and odd.val[0][1] == full.val[0][1]


def test_float32_whatever_the_default_dtype():
    """fp64 runs make tensors in float64 while a rank runs; the loader's images stay float32, as digits'."""
    data = build_datasets("bigdigits:64").train
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        x, _ = data[-1]
    finally:
        torch.set_default_dtype(before)
    assert x.dtype == torch.float32 and torch.equal(x, data[len(data) - 1][0])


def test_a_large_canvas_is_not_held_in_memory():
    data = build_datasets("bigdigits:8192")
    for split in (data.train, data.val):
        held = vars(split).values()
        assert not any(isinstance(v, torch.Tensor) for v in held)
        assert sum(v.nbytes for v in held if isinstance(v, np.ndarray)) < 2 ** 20  # the 8 x 8 digits only
    assert len(data.train) == 1437 and data.image_size == 8192


def test_the_smallest_canvas_holds_the_digit():
    data = build_datasets("bigdigits:32", image_size=4)
    assert data.train[0][0].shape == (1, 4, 4) and default_image_size("bigdigits:32") == 32


def test_inputs_are_near_zero_mean_unit_std():
    data = build_datasets("bigdigits:64").train
    xs = torch.stack([data[i][0] for i in range(32)])
    assert abs(float(xs.mean())) < 0.15 and 0.8 < float(xs.std()) < 1.2
    assert MEAN > 0 and STD > 0


@pytest.mark.parametrize("spec, size, words", [
    ("bigdigits:big", None, "bigdigits:big: give the canvas side in pixels"),
    ("bigdigits:2.5", None, "bigdigits:2.5: give the canvas side in pixels"),
    ("bigdigits:", None, "bigdigits:: give the canvas side in pixels"),
    ("bigdigits:8", None, "must be at least 32"),
    ("bigdigits:31", None, "must be at least 32"),
    ("bigdigits:128", 256, "--image-size 256 with bigdigits:128: the canvas can only be averaged down"),
])
def test_bad_specs_are_one_line(spec, size, words):
    with pytest.raises(UserError) as e:
        build_datasets(spec, image_size=size)
    assert words in str(e.value) and "\n" not in str(e.value)
