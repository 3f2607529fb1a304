"""Rows per leaf module (perf/layers.py): they add up to the model's parameters and FLOPs, with the right shapes."""

import pytest
import torch
from torch import nn

from scaletrain.models import build_model
from scaletrain.perf.flops import count_params, forward_flops
from scaletrain.perf.layers import OUTSIDE, layer_table


def _meta(name, channels, size):
    with torch.device("meta"):
        return build_model(name, num_classes=10, in_channels=channels, image_size=size)


@pytest.mark.parametrize("name, channels, size", [("lenet5", 1, 32), ("resnet20", 3, 32)])
def test_rows_add_up_to_the_models_parameters_and_flops(name, channels, size):
    model = _meta(name, channels, size)
    rows = layer_table(model, (channels, size, size))
    assert sorted(r.name for r in rows) == sorted(n for n, m in model.named_modules() if not list(m.children()))
    assert all(r.name != OUTSIDE and r.calls >= 1 for r in rows)  # every FLOP inside a leaf, every leaf ran
    assert sum(r.params for r in rows) == count_params(model)
    assert sum(r.param_bytes for r in rows) == 4 * count_params(model)
    assert sum(r.flops for r in rows) == forward_flops(model, (channels, size, size))
    assert rows[-1].output_shape == (1, 10)


def test_lenet5_rows():
    rows = {r.name: r for r in layer_table(_meta("lenet5", 1, 32), (1, 32, 32), batch_size=8)}
    conv1, pool2, fc1 = rows["features.0"], rows["features.5"], rows["classifier.0"]
    assert (conv1.kind, conv1.output_shape, conv1.params) == ("Conv2d", (8, 6, 28, 28), 6 * 25 + 6)
    assert conv1.flops == 8 * 2 * 6 * 25 * 28 * 28  # 2 per multiply-add, the batch of 8
    assert conv1.activation_bytes == 4 * 8 * 6 * 28 * 28
    assert (pool2.kind, pool2.output_shape, pool2.flops, pool2.params) == ("MaxPool2d", (8, 16, 5, 5), 0, 0)
    assert (fc1.output_shape, fc1.params, fc1.flops) == ((8, 120), 400 * 120 + 120, 8 * 2 * 400 * 120)


def test_resnet20_shapes_and_a_reused_relu():
    table = layer_table(_meta("resnet20", 3, 32), (3, 32, 32), batch_size=2)
    # rows in the order they run: the block's ReLU runs between bn1 and conv2 (it is defined after bn2)
    assert [r.name for r in table[3:8]] == ["layer1.0.conv1", "layer1.0.bn1", "layer1.0.relu", "layer1.0.conv2",
                                            "layer1.0.bn2"]
    rows = {r.name: r for r in table}
    assert rows["stem.0"].output_shape == (2, 16, 32, 32)
    assert rows["layer2.0.conv1"].output_shape == (2, 32, 16, 16)  # the first block of a stage halves the map
    assert rows["layer3.2.conv2"].output_shape == (2, 64, 8, 8)
    relu = rows["layer1.0.relu"]  # the block applies its ReLU twice: both outputs are counted
    assert relu.calls == 2 and relu.activation_bytes == 2 * 4 * 2 * 16 * 32 * 32
    assert rows["fc"].params == 64 * 10 + 10


def test_a_real_device_model_gives_the_same_rows_and_keeps_its_mode():
    torch.manual_seed(0)
    real = build_model("lenet5", num_classes=10, in_channels=1, image_size=32)
    assert layer_table(real, (1, 32, 32)) == layer_table(_meta("lenet5", 1, 32), (1, 32, 32))
    assert real.training and not real._forward_hooks and not real.features[0]._forward_pre_hooks


class _Functional(nn.Module):
    """A container that runs a matmul itself, a shared layer, and a leaf it never calls."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 2)
        self.weight = nn.Parameter(torch.zeros(4, 3))

    def forward(self, x):
        return self.fc(self.fc(x)) @ self.weight


def test_flops_outside_leaves_get_a_row_and_unused_leaves_come_last():
    model = _Functional()
    rows = layer_table(model, (4,))
    assert [r.name for r in rows] == ["fc", "unused", OUTSIDE]
    fc, unused, outside = rows
    assert fc.calls == 2 and fc.flops == 2 * 2 * 16 and fc.output_shape == (1, 4)
    assert (unused.calls, unused.output_shape, unused.flops, unused.params) == (0, (), 0, 10)
    assert outside.flops == 2 * 4 * 3 and sum(r.flops for r in rows) == forward_flops(model, (4,))
