"""Tests for `model_rows`, the data behind the `scaletrain models` listing."""

from __future__ import annotations

import pytest

from scaletrain.models import build_model, model_names, model_rows
from scaletrain.perf.flops import count_params


def test_rows_at_cifar_size():
    rows = model_rows(image_size=32, in_channels=3, num_classes=10)
    assert [r["name"] for r in rows] == model_names()
    for row in rows:
        assert set(row) == {"name", "description", "params", "flops", "note"}
        assert isinstance(row["params"], int) and row["params"] > 0
        assert row["description"]
        if row["name"] == "alexnet":
            assert row["flops"] is None and "63x63" in row["note"]
        else:
            assert isinstance(row["flops"], int) and row["flops"] > 0 and row["note"] is None
    by_name = {r["name"]: r for r in rows}
    assert by_name["resnet20"]["params"] == 269_722
    real = build_model("lenet5", num_classes=10, in_channels=3, image_size=32)
    assert by_name["lenet5"]["params"] == count_params(real)


def test_rows_at_imagenet_size():
    rows = {r["name"]: r for r in model_rows(image_size=224, in_channels=3, num_classes=1000)}
    assert all(r["note"] is None and isinstance(r["flops"], int) for r in rows.values())
    assert rows["resnet18"]["params"] == 11_689_512
    assert rows["resnet18"]["flops"] == pytest.approx(3.64e9, rel=0.02)
    assert rows["vgg16"]["flops"] > rows["vgg11"]["flops"] > rows["resnet50"]["flops"] > rows["resnet18"]["flops"]


def test_rows_at_tiny_size_explain_instead_of_failing():
    rows = {r["name"]: r for r in model_rows(image_size=8, in_channels=1, num_classes=10)}
    for name, minimum in [("alexnet", 63), ("lenet5", 16), ("vgg11", 32), ("vgg16", 32)]:
        assert rows[name]["flops"] is None
        assert rows[name]["note"].startswith(f"needs images of at least {minimum}x{minimum}")
        assert isinstance(rows[name]["params"], int) and rows[name]["params"] > 0
    assert rows["mlp"]["flops"] == 2 * (64 * 512 + 512 * 256 + 256 * 10)
