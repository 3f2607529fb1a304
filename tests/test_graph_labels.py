"""graph/labels.py: numbers in short units and a node's label lines."""

from __future__ import annotations

from scaletrain.graph import labels


def test_numbers_read_short():
    assert [labels.count(n) for n in (0, 999, 1234, 2_600_000_000)] == ["0", "999", "1.23K", "2.6G"]
    assert labels.count(None) == "-" and labels.flops(28_300_000) == "28.3M FLOPs"
    assert labels.shape([32, 16, 8, 8]) == "32x16x8x8" and labels.shape(None) == "(not one tensor)"


def test_kinds_are_counted_abbreviated_and_cut_to_width():
    block = ["Conv2d", "BatchNorm2d", "ReLU", "Conv2d", "BatchNorm2d", "Identity", "add", "ReLU"]
    assert labels.kinds(block) == "Conv x2, BN x2, ReLU x2, add"  # Identity: nothing to see
    assert labels.kinds(["Identity"]) == "Identity"
    assert len(labels.kinds([f"Kind{i}" for i in range(20)], width=30)) <= 30


def test_a_nodes_lines_carry_its_time_only_when_predicted():
    node = {"name": "layer1.0", "kinds": ["Conv2d"], "out_shape": [2, 4], "params": 1200, "flops": 5e6,
            "forward_s": None, "backward_s": None}
    assert labels.lines(node) == ["layer1.0", "Conv", "2x4", "1.2K params, 5M FLOPs"]
    node.update(forward_s=0.001, backward_s=0.002)
    assert labels.lines(node)[-1] == "fwd 1 ms, bwd 2 ms"
