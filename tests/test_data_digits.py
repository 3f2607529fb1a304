"""Tests for the sklearn digits dataset: split, resizing, normalisation, augmentation."""

import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scaletrain.data import build_datasets
from scaletrain.data.digits import load_digits_split


@pytest.fixture(scope="module")
def digits():
    return build_datasets("digits", augment=False)


def _stack(ds, n=None):
    n = len(ds) if n is None else n
    xs, ys = zip(*(ds[i] for i in range(n)))
    return torch.stack(xs), torch.tensor(ys)


def test_split_sizes_and_shapes(digits):
    assert (len(digits.train), len(digits.val)) == (1437, 360)
    assert (digits.num_classes, digits.in_channels, digits.image_size) == (10, 1, 32)
    x, y = digits.train[0]
    assert x.shape == (1, 32, 32) and x.dtype == torch.float32 and isinstance(y, int)


def test_split_is_stratified_disjoint_and_complete():
    train, val = load_digits_split()
    assert set(train.indices).isdisjoint(val.indices)
    assert len(set(train.indices) | set(val.indices)) == 1797
    counts = np.bincount(val.labels, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # ~20% of each class's ~180


def test_split_independent_of_seed(digits):
    other = build_datasets("digits", seed=123, augment=False)
    assert torch.equal(_stack(digits.val)[0], _stack(other.val)[0])
    assert torch.equal(_stack(digits.train)[1], _stack(other.train)[1])


def test_train_split_is_normalised(digits):
    x, _ = _stack(digits.train)
    assert abs(float(x.mean())) < 1e-4
    assert abs(float(x.std()) - 1.0) < 1e-3


def test_resized_images_are_the_digits(digits):
    # 1-nearest-neighbour from val to train on the resized data: real digits score ~0.98, noise ~0.1.
    xt, yt = _stack(digits.train)
    xv, yv = _stack(digits.val)
    nearest = torch.cdist(xv.flatten(1), xt.flatten(1)).argmin(1)
    assert (yt[nearest] == yv).float().mean() > 0.9


def test_resize_preserves_the_8x8_content():
    train, _ = load_digits_split()
    b = build_datasets("digits", image_size=32, augment=False)
    x, _ = _stack(b.train, 50)
    back = F.avg_pool2d(x, 4).flatten(1)  # 32 -> 8
    orig = torch.as_tensor(train.images[:50], dtype=torch.float32).flatten(1)
    corr = np.corrcoef(back.flatten().numpy(), orig.flatten().numpy())[0, 1]
    assert corr > 0.9


def test_other_image_size():
    b = build_datasets("digits", image_size=16)
    assert b.image_size == 16 and b.train[0][0].shape == (1, 16, 16) and b.val[0][0].shape == (1, 16, 16)


def test_augmentation_reproducible_under_manual_seed():
    b = build_datasets("digits", augment=True)
    torch.manual_seed(7)
    first = _stack(b.train, 40)[0]
    torch.manual_seed(7)
    second = _stack(b.train, 40)[0]
    torch.manual_seed(8)
    third = _stack(b.train, 40)[0]
    assert torch.equal(first, second)
    assert not torch.equal(first, third)


def test_augmentation_is_a_bounded_translation_with_background_fill(digits):
    aug = build_datasets("digits", augment=True).train
    fill = float(digits.train.images.min())  # raw 0 (black) after normalisation
    torch.manual_seed(0)
    shifted = 0
    for i in range(30):
        plain, _ = digits.train[i]
        moved, _ = aug[i]
        matches = []
        for dy in range(-2, 3):  # image_size 32 // 16 = 2
            for dx in range(-2, 3):
                padded = F.pad(plain, (2, 2, 2, 2), value=fill)
                cand = padded[:, 2 - dy:2 - dy + 32, 2 - dx:2 - dx + 32]
                if torch.allclose(cand, moved):
                    matches.append((dy, dx))
        assert matches, f"item {i} is not a translation of the original by <= 2 px"
        shifted += (0, 0) not in matches
    assert shifted >= 15  # P(no shift) is 1/25 per item


def test_validation_is_not_augmented():
    b = build_datasets("digits", augment=True)
    torch.manual_seed(0)
    a = b.val[3][0]
    torch.manual_seed(1)
    assert torch.equal(a, b.val[3][0])


def test_items_are_copies_and_dataset_pickles():
    b = build_datasets("digits", augment=False)
    x, _ = b.train[0]
    x.zero_()  # must not corrupt the dataset
    assert b.train[0][0].abs().sum() > 0
    clone = pickle.loads(pickle.dumps(b.train))
    assert torch.equal(clone[5][0], b.train[5][0]) and clone[5][1] == b.train[5][1]


def test_the_split_is_kept_in_the_cache_and_read_back_without_sklearn(tmp_path, monkeypatch):
    from scaletrain.data import digits as module

    fresh = module._split_with_sklearn()
    assert [s.images.shape[0] for s in module.load_digits_split(tmp_path)] == [1437, 360]  # made and kept
    assert (tmp_path / module.SPLIT_CACHE).is_file()

    def no_sklearn():
        raise AssertionError("the cached split was not read")

    monkeypatch.setattr(module, "_split_with_sklearn", no_sklearn)
    for got, want in zip(module.load_digits_split(tmp_path), fresh):
        assert got.images.dtype == want.images.dtype and np.array_equal(got.images, want.images)
        assert np.array_equal(got.labels, want.labels) and np.array_equal(got.indices, want.indices)


def test_a_damaged_cache_is_made_again(tmp_path):
    from scaletrain.data import digits as module

    (tmp_path / module.SPLIT_CACHE).write_bytes(b"PK\x03\x04 not a whole file")
    train, val = module.load_digits_split(tmp_path)
    assert (len(train.labels), len(val.labels)) == (1437, 360)
    with np.load(tmp_path / module.SPLIT_CACHE) as z:
        assert np.array_equal(z["val_indices"], val.indices)
