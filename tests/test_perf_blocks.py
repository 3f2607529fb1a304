"""perf/blocks.py: the layer graph of every built-in model grouped at the layer, block and module levels
(counts, FLOPs and parameters adding up to the whole model's, cut points), and a branchy model whose
parallel branches, inception-like concatenation and depthwise-separable pair each form one block."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from scaletrain.models import build_model, model_names
from scaletrain.models.registry import minimum_image_size
from scaletrain.perf.blocks import LEVELS, group
from scaletrain.perf.flops import count_params, forward_flops
from scaletrain.perf.walk import cut_points, layer_graph

# blocks: stem + residual blocks + fc (the global pool joins the last residual block), one per conv or
# linear layer for the plain networks; modules: the top-level children (the pool with the flatten after it)
EXPECTED = {
    "alexnet": (8, 3),  # 5 conv + 3 linear; features, pool, classifier
    "lenet5": (5, 2),  # 2 conv + 3 linear; features, classifier
    "mlp": (3, 1),  # 3 linear; net
    "resnet18": (1 + 8 + 1, 7),  # stem, layer1-4, pool, fc
    "resnet34": (1 + 16 + 1, 7),
    "resnet50": (1 + 16 + 1, 7),
    "resnet20": (1 + 9 + 1, 6),  # stem, layer1-3, pool, fc
    "resnet56": (1 + 27 + 1, 6),
    "vgg11": (8 + 1, 3),  # 8 conv + the classifier's linear; features, pool, classifier
    "vgg16": (13 + 1, 3),
}
_SKIP = ("placeholder", "output", "get_attr")


@functools.lru_cache(maxsize=None)
def traced(name: str):
    size = max(32, minimum_image_size(name, image_size=32))
    with torch.device("meta"):  # shapes and FLOPs without initialising or computing anything: fast
        model = build_model(name, num_classes=10, in_channels=3, image_size=size)
    return model, (3, size, size), layer_graph(model, (3, size, size))


def test_every_built_in_model_is_expected():
    assert sorted(EXPECTED) == model_names()


@pytest.mark.parametrize("name", model_names())
def test_every_level_adds_up_to_the_whole_models_flops_and_parameters(name):
    model, shape, graph = traced(name)
    computing = [n.id for n in graph.nodes if n.op not in _SKIP]
    flops, params = forward_flops(model, shape), count_params(model)
    for level in LEVELS:
        blocks = group(graph, level)
        assert [b.id for b in blocks] == list(range(len(blocks)))
        assert [i for b in blocks for i in b.nodes] == computing  # a partition, contiguous, in traced order
        assert sum(b.flops for b in blocks) == flops, level
        assert sum(b.params for b in blocks) == params, level
        assert all(src < b.id for b in blocks for src in b.inputs), level
        assert not blocks[-1].cut_after and blocks[-1].out_shape == (1, 10)


@pytest.mark.parametrize("name", model_names())
def test_node_and_edge_counts_and_cut_points_at_each_level(name):
    _, _, graph = traced(name)
    computing = {n.id for n in graph.nodes if n.op not in _SKIP}
    cuts = set(cut_points(graph))

    layers = group(graph, "layer")
    assert len(layers) == len(computing)
    assert sum(len(b.inputs) for b in layers) == len([e for e in graph.edges if set(e) <= computing])
    assert [b.cut_after for b in layers[:-1]] == [b.nodes[0] in cuts for b in layers[:-1]]

    blocks = group(graph, "block")
    assert len(blocks) == EXPECTED[name][0]
    assert [b.inputs for b in blocks] == [[]] + [[i] for i in range(len(blocks) - 1)]  # a chain
    assert all(b.cut_after and b.nodes[-1] in cuts for b in blocks[:-1])  # every boundary is a cut point

    modules = group(graph, "module")
    assert len(modules) == EXPECTED[name][1]
    assert all(m.cut_after == (m.nodes[-1] in cuts) for m in modules[:-1])
    assert len({m.name for m in modules}) == len(modules)


def test_a_residual_block_is_one_block_and_named_after_its_module():
    _, _, graph = traced("resnet20")
    blocks = group(graph, "block")
    by_id = {n.id: n for n in graph.nodes}
    names = [b.name for b in blocks]
    assert names == ["stem"] + [f"layer{s}.{i}" for s in (1, 2, 3) for i in (0, 1, 2)][:-1] + ["layer3.2+pool", "fc"]
    for b in blocks[1:-1]:
        assert b.kinds.count("add") == 1 and b.kinds.count("Conv2d") == 2  # the whole residual block
        assert b.out_shape == by_id[b.nodes[-1]].shape
        assert b.saved_bytes > b.out_bytes > 0


def test_a_plain_networks_blocks_are_named_by_the_children_they_cover():
    _, _, graph = traced("vgg11")
    names = [b.name for b in group(graph, "block")]
    assert names[:3] == ["features.0-3", "features.4-7", "features.8-10"]
    assert names[-2].endswith("+pool")

    seq = nn.Sequential(nn.ReLU(), nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    seq(torch.zeros(1, 3, 8, 8))  # materialise the lazy layer
    blocks = group(layer_graph(seq, (3, 8, 8)), "block")
    assert [b.name for b in blocks] == ["0-3", "4"]  # the leading ReLU, without FLOPs, joins the conv's block


def test_an_unknown_level_is_refused():
    with pytest.raises(ValueError, match="layer, block, module"):
        group(traced("lenet5")[2], "stage")


class Branchy(nn.Module):
    """Two parallel branches joined by an add, an inception-like concatenation of four branches, and a
    depthwise-separable pair (depthwise conv, BN, ReLU, pointwise conv)."""

    def __init__(self, c: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.left = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.ReLU())
        self.right = nn.Sequential(nn.Conv2d(c, c, 1), nn.ReLU())
        self.b1 = nn.Conv2d(c, 4, 1)
        self.b3 = nn.Conv2d(c, 4, 3, padding=1)
        self.b5 = nn.Conv2d(c, 4, 5, padding=2)
        self.bp = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(c, 4, 1))
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.dw_bn = nn.BatchNorm2d(16)
        self.pw = nn.Conv2d(16, 32, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = self.left(x) + self.right(x)
        x = torch.cat([self.b1(x), self.b3(x), self.b5(x), self.bp(x)], dim=1)
        x = self.pw(torch.relu(self.dw_bn(self.dw(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def test_branches_an_inception_module_and_a_depthwise_separable_pair_each_form_one_block():
    model = Branchy()
    graph = layer_graph(model, (3, 16, 16), batch_size=2)
    blocks = group(graph, "block")
    targets = [[graph.nodes[i].target if graph.nodes[i].op == "call_module" else graph.nodes[i].kind for i in b.nodes]
               for b in blocks]
    assert targets == [["stem", "relu"],
                       ["left.0", "left.1", "right.0", "right.1", "add"],
                       ["b1", "b3", "b5", "bp.0", "bp.1", "cat"],
                       ["dw", "dw_bn", "relu", "pw", "pool", "flatten"],
                       ["fc"]]
    assert [b.name for b in blocks] == ["stem", "left+right", "b1+b3+b5+bp", "dw+dw_bn+pw+pool", "fc"]
    assert [b.out_shape for b in blocks] == [(2, 8, 16, 16), (2, 8, 16, 16), (2, 16, 16, 16), (2, 32), (2, 10)]
    assert sum(b.flops for b in blocks) == 2 * forward_flops(model, (3, 16, 16))
    assert sum(b.params for b in blocks) == count_params(model)

    layers = group(graph, "layer")
    inside = {b.name: b.cut_after for b in layers}
    assert not any(inside[k] for k in ("left.0", "left.1", "right.0", "right.1", "b1", "b3", "b5", "bp.0", "bp.1"))
    assert inside["add"] and inside["cat"] and inside["dw"]  # one tensor after the depthwise conv, yet no block end
    assert len(layers) == 20
    assert sum(len(b.inputs) for b in layers) == 19 + 1 + 3  # a chain's, and the add's and the cat's extra inputs

    modules = group(graph, "module")
    assert [m.name for m in modules] == ["stem", "left", "right", "b1", "b3", "b5", "bp", "dw", "dw_bn", "pw", "pool",
                                         "fc"]
    right = modules[2]
    assert right.inputs == [0, 1] and right.cut_after  # the add (a function) joins the module before it
    assert not modules[1].cut_after  # the left branch is still in flight
