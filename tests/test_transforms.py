"""Tests for the hand-written image transforms."""

import math
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from PIL import Image

from scaletrain.data.transforms import (IMAGENET_MEAN, IMAGENET_STD, CenterCrop, Compose, Normalize,
                                        RandomHorizontalFlip, RandomResizedCrop, Resize, ToTensor,
                                        imagenet_train_transform, imagenet_val_transform)


def _rgb(w, h, seed=0):
    arr = np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    return Image.fromarray(arr)


@settings(max_examples=200, deadline=None)
@given(w=st.integers(8, 600), h=st.integers(8, 600), seed=st.integers(0, 2**31 - 1))
def test_random_resized_crop_params_in_range(w, h, seed):
    torch.manual_seed(seed)
    t = RandomResizedCrop(32)
    left, top, cw, ch = t.get_params(w, h)
    assert 0 <= left and 0 <= top and 1 <= cw and 1 <= ch
    assert left + cw <= w and top + ch <= h
    if 3 / 4 <= w / h <= 4 / 3:
        # Crops are rounded to whole pixels, so allow half a pixel either way on each side.
        assert (cw + 0.5) * (ch + 0.5) >= 0.08 * w * h
        assert (cw - 0.5) * (ch - 0.5) <= w * h
        assert (cw + 0.5) / (ch - 0.5) >= 3 / 4 - 1e-9
        assert (cw - 0.5) / (ch + 0.5) <= 4 / 3 + 1e-9


@settings(max_examples=100, deadline=None)
@given(w=st.integers(1, 2000), h=st.integers(1, 2000), seed=st.integers(0, 1000))
def test_random_resized_crop_fallback_stays_inside_extreme_shapes(w, h, seed):
    torch.manual_seed(seed)
    left, top, cw, ch = RandomResizedCrop(16).get_params(w, h)
    assert 0 <= left <= left + cw <= w and 0 <= top <= top + ch <= h and cw >= 1 and ch >= 1


def test_random_resized_crop_covers_the_scale_range():
    torch.manual_seed(0)
    t = RandomResizedCrop(32)
    fracs = [cw * ch / (400 * 400) for _, _, cw, ch in (t.get_params(400, 400) for _ in range(500))]
    assert min(fracs) < 0.15 and max(fracs) > 0.9


def test_random_resized_crop_output_size_and_reproducibility():
    img = _rgb(300, 200)
    t = RandomResizedCrop((24, 40))
    torch.manual_seed(1)
    a = t(img)
    torch.manual_seed(1)
    b = t(img)
    assert a.size == (40, 24)  # PIL size is (w, h)
    assert np.array_equal(np.asarray(a), np.asarray(b))


def test_horizontal_flip_pil_and_tensor():
    img = _rgb(5, 3)
    flipped = RandomHorizontalFlip(p=1.0)(img)
    assert np.array_equal(np.asarray(flipped), np.asarray(img)[:, ::-1])
    assert RandomHorizontalFlip(p=0.0)(img) is img
    x = torch.arange(6.0).view(1, 2, 3)
    assert RandomHorizontalFlip(p=1.0)(x).tolist() == [[[2.0, 1.0, 0.0], [5.0, 4.0, 3.0]]]


def test_horizontal_flip_happens_about_half_the_time():
    torch.manual_seed(0)
    x = torch.tensor([[[0.0, 1.0]]])
    flips = sum(RandomHorizontalFlip()(x)[0, 0, 0].item() == 1.0 for _ in range(1000))
    assert 400 < flips < 600


@pytest.mark.parametrize("w,h,size,expect", [(400, 300, 100, (133, 100)), (300, 400, 100, (100, 133)),
                                             (50, 50, 64, (64, 64)), (640, 480, (20, 30), (30, 20))])
def test_resize_sizes(w, h, size, expect):
    assert Resize(size)(_rgb(w, h)).size == expect


def test_center_crop_picks_the_center():
    arr = np.zeros((9, 11, 3), dtype=np.uint8)
    arr[4, 5] = 255  # the exact centre pixel of an 11x9 image
    out = np.asarray(CenterCrop(3)(Image.fromarray(arr)))
    assert out.shape == (3, 3, 3)
    assert out[1, 1].tolist() == [255, 255, 255] and out.sum() == 3 * 255
    x = torch.arange(36.0).view(1, 6, 6)
    assert CenterCrop(2)(x).tolist() == [[[14.0, 15.0], [20.0, 21.0]]]


def test_to_tensor_layout_and_range():
    arr = np.zeros((2, 3, 3), dtype=np.uint8)
    arr[0, 1] = (255, 0, 51)
    x = ToTensor()(Image.fromarray(arr))
    assert x.shape == (3, 2, 3) and x.dtype == torch.float32
    assert x[:, 0, 1].tolist() == pytest.approx([1.0, 0.0, 0.2])
    assert x.sum().item() == pytest.approx(1.2)
    gray = ToTensor()(Image.fromarray(np.full((4, 5), 255, dtype=np.uint8)))
    assert gray.shape == (1, 4, 5) and torch.all(gray == 1.0)


def test_normalize_maths():
    x = torch.rand(3, 4, 4)
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.25, 2.0)
    y = Normalize(mean, std)(x)
    for c in range(3):
        assert torch.allclose(y[c], (x[c] - mean[c]) / std[c])
    with pytest.raises(ValueError):
        Normalize((0.5,), (0.0,))
    with pytest.raises(ValueError):
        Normalize(mean, std)(torch.rand(1, 4, 4))


def test_compose_applies_in_order():
    assert Compose([lambda v: v + 1, lambda v: v * 10])(1) == 20


def test_imagenet_pipelines_shapes_and_statistics():
    img = _rgb(320, 180)
    torch.manual_seed(0)
    tr = imagenet_train_transform(64)(img)
    va = imagenet_val_transform(64)(img)
    assert tr.shape == va.shape == (3, 64, 64)
    # Val: resize short side to round(64/0.875)=73, so a uniform grey image maps to exactly (g - mean) / std.
    grey = Image.new("RGB", (100, 80), (128, 128, 128))
    out = imagenet_val_transform(64)(grey)
    for c in range(3):
        assert torch.allclose(out[c], torch.tensor((128 / 255 - IMAGENET_MEAN[c]) / IMAGENET_STD[c]), atol=1e-5)
    assert Resize(int(round(64 / 0.875))).output_size(100, 80) == (round(73 * 100 / 80), 73)


def test_transforms_pickle():
    t = imagenet_train_transform(32)
    clone = pickle.loads(pickle.dumps(t))
    img = _rgb(50, 40)
    torch.manual_seed(3)
    a = t(img)
    torch.manual_seed(3)
    assert torch.equal(a, clone(img))
    assert not math.isnan(float(a.mean()))
