"""Tests for collate and BadSample."""

import pickle

import torch

from scaletrain.data import BadSample, collate


def _good(v, y):
    return torch.full((3, 4, 4), float(v)), y


def test_stacks_good_samples():
    x, y, bad = collate([_good(1, 2), _good(2, 5)])
    assert x.shape == (2, 3, 4, 4) and x.dtype == torch.float32
    assert y.tolist() == [2, 5] and y.dtype == torch.int64
    assert bad == []


def test_drops_and_reports_bad_samples_keeping_order():
    samples = [_good(1, 0), BadSample("/d/a.jpg", "OSError: truncated", (3, 4, 4)), _good(3, 1),
               BadSample("/d/b.png", "cannot identify")]
    x, y, bad = collate(samples)
    assert x.shape == (2, 3, 4, 4) and y.tolist() == [0, 1]
    assert x[:, 0, 0, 0].tolist() == [1.0, 3.0]
    assert bad == ["/d/a.jpg: OSError: truncated", "/d/b.png: cannot identify"]


def test_all_bad_batch_is_empty_with_trailing_shape():
    x, y, bad = collate([BadSample("p1", "r1", (3, 8, 8)), BadSample("p2", "r2", (3, 8, 8))])
    assert x.shape == (0, 3, 8, 8) and x.dtype == torch.float32
    assert y.shape == (0,) and y.dtype == torch.int64
    assert bad == ["p1: r1", "p2: r2"]


def test_bad_sample_pickles():
    s = BadSample("x.jpg", "broken", (3, 2, 2))
    assert pickle.loads(pickle.dumps(s)) == s
