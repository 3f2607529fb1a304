"""Tests for the synthetic dataset and the spec registry."""

import pickle

import pytest
import torch

from scaletrain.data import build_datasets, dataset_names
from scaletrain.errors import UserError


def test_shapes_sizes_and_labels():
    b = build_datasets("synthetic", synthetic_samples=400, synthetic_classes=7, synthetic_channels=2, image_size=12)
    assert (len(b.train), len(b.val)) == (400, 100)
    assert (b.num_classes, b.in_channels, b.image_size) == (7, 2, 12)
    ys = set()
    for i in range(len(b.train)):
        x, y = b.train[i]
        assert x.shape == (2, 12, 12) and x.dtype == torch.float32
        ys.add(y)
    assert ys == set(range(7))


def test_default_image_size_is_32():
    assert build_datasets("synthetic", synthetic_samples=8).train[0][0].shape == (3, 32, 32)


def test_deterministic_across_instances_and_seed_dependent():
    a = build_datasets("synthetic", seed=3, synthetic_samples=64)
    b = build_datasets("synthetic", seed=3, synthetic_samples=64)
    c = build_datasets("synthetic", seed=4, synthetic_samples=64)
    for i in (0, 17, 63):
        assert torch.equal(a.train[i][0], b.train[i][0]) and a.train[i][1] == b.train[i][1]
    assert torch.equal(a.val[5][0], b.val[5][0])
    assert not torch.equal(a.train[0][0], c.train[0][0])
    # Order of access and global RNG state must not matter.
    torch.manual_seed(99)
    assert torch.equal(a.train[17][0], pickle.loads(pickle.dumps(b.train))[17][0])


def test_val_items_differ_from_train_items():
    b = build_datasets("synthetic", synthetic_samples=16)
    assert not any(torch.equal(b.val[i][0], b.train[j][0]) for i in range(4) for j in range(16))


def test_index_out_of_range():
    b = build_datasets("synthetic", synthetic_samples=8)
    with pytest.raises(IndexError):
        b.train[8]
    assert torch.equal(b.train[-1][0], b.train[7][0])


def test_labels_are_learnable_from_channel_means():
    # The weak class signal lets smoke runs show learning; nearest class-mean on channel averages beats chance.
    b = build_datasets("synthetic", synthetic_samples=2000, synthetic_classes=4, image_size=8)
    feats = torch.stack([b.train[i][0].mean((1, 2)) for i in range(2000)])
    ys = torch.tensor([b.train[i][1] for i in range(2000)])
    centroids = torch.stack([feats[ys == k].mean(0) for k in range(4)])
    acc = (torch.cdist(feats, centroids).argmin(1) == ys).float().mean()
    assert acc > 0.8  # chance is 0.25


def test_dataset_names_and_unknown_spec():
    assert dataset_names() == ["digits", "bigdigits:SIZE", "imagefolder:PATH", "synthetic"]
    with pytest.raises(UserError, match="unknown dataset 'mnist'.*digits, bigdigits:SIZE, imagefolder:PATH, synthetic"):
        build_datasets("mnist")
    with pytest.raises(UserError, match="unknown dataset"):
        build_datasets("digits:foo")


@pytest.mark.parametrize("kwargs", [{"image_size": 0}, {"synthetic_samples": 2}, {"synthetic_classes": 0}])
def test_bad_numbers_are_user_errors(kwargs):
    with pytest.raises(UserError):
        build_datasets("synthetic", **kwargs)
