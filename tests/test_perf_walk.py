"""perf/walk.py: the fx layer graph of every built-in model (FLOPs and parameters against the whole-model
counts), its edges, and the cut points where exactly one tensor crosses."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from torch import nn

from scaletrain.models import build_model, model_names
from scaletrain.perf.flops import count_params, forward_flops
from scaletrain.perf import walk
from scaletrain.perf.walk import Untraceable, cut_points, fits_meta_batch_norm, layer_graph, meta_batch_norm


@pytest.mark.parametrize("name", model_names())
def test_every_models_graph_adds_up_to_its_flops_and_parameters(name):
    model = build_model(name, num_classes=10, in_channels=3, image_size=64)
    graph = layer_graph(model, (3, 64, 64))
    assert sum(n.flops for n in graph.nodes) == forward_flops(model, (3, 64, 64))
    assert sum(n.params for n in graph.nodes) == count_params(model)
    assert graph.nodes[-1].op == "output" and graph.nodes[-2].shape == (1, 10)
    assert all(s < t for s, t in graph.edges)  # fx's order is topological


def test_the_layers_walked_outside_the_flop_counter_count_none_in_it():
    """perf/walk.NO_FLOPS (norms, activations, pooling, ...) run outside FlopCounterMode: the sum is still the whole
    model's count, on real tensors and on meta ones, a norm's and an activation's own count 0."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.GELU(), nn.AvgPool2d(2),
                          nn.InstanceNorm2d(8, affine=True), nn.SiLU(), nn.AdaptiveMaxPool2d(2), nn.Flatten(),
                          nn.Dropout(0.1), nn.Linear(32, 16), nn.LayerNorm(16), nn.Hardswish(), nn.Linear(16, 4))
    whole = forward_flops(model, (3, 8, 8))
    assert sum(n.flops for n in layer_graph(model, (3, 8, 8)).nodes) == whole > 0
    with torch.device("meta"):
        meta = layer_graph(copy.deepcopy(model).to("meta"), (3, 8, 8))
    assert sum(n.flops for n in meta.nodes) == whole
    assert [n.flops for n in meta.nodes if n.kind in ("GroupNorm", "GELU", "LayerNorm")] == [0, 0, 0]


def _saved(fn):
    """(the output's shape, dtype and strides; the sizes and dtypes of what autograd saved) of fn() on meta."""
    kept = []

    def pack(t):
        kept.append((tuple(t.shape), t.dtype, t.untyped_storage().nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.enable_grad():
        y = fn()
    return (tuple(y.shape), y.dtype, y.stride(), y.requires_grad), kept


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", [lambda: nn.BatchNorm2d(6), lambda: nn.BatchNorm2d(6, affine=False),
                                  lambda: nn.BatchNorm2d(6, track_running_stats=False), lambda: nn.BatchNorm1d(6)])
@pytest.mark.parametrize("training", [True, False])
def test_a_meta_batch_norm_keeps_what_the_module_keeps(norm, dtype, training):
    """perf/walk.meta_batch_norm stands for a batch norm on meta tensors (whose decomposition took most of a walk):
    the same output and the same tensors saved for backward, in every mode."""
    module = norm().to("meta").to(dtype).train(training)
    x = torch.empty((4, 6) if isinstance(module, nn.BatchNorm1d) else (4, 6, 5, 5), device="meta", dtype=dtype)
    assert fits_meta_batch_norm(module, (x,))
    assert _saved(lambda: meta_batch_norm(module, x)) == _saved(lambda: module(x))


def test_a_meta_walk_is_the_same_with_batch_norm_stood_in_for(monkeypatch):
    """ResNet-50's meta walk, node by node, with and without the stand-in (and a channel count that does not fit
    runs the module, which says so)."""
    with torch.device("meta"):
        model = build_model("resnet50", num_classes=10, in_channels=3, image_size=64)
    fast = layer_graph(model, (3, 64, 64), 8)
    monkeypatch.setattr(walk, "fits_meta_batch_norm", lambda module, args: False)
    slow = layer_graph(model, (3, 64, 64), 8)
    assert fast.saved_bytes == slow.saved_bytes > 0
    assert [(n.shape, n.flops, n.out_bytes, n.saved_bytes) for n in fast.nodes] == \
        [(n.shape, n.flops, n.out_bytes, n.saved_bytes) for n in slow.nodes]
    assert not fits_meta_batch_norm(nn.BatchNorm2d(5).to("meta"), (torch.empty(2, 6, 3, 3, device="meta"),))


def test_lenet5_is_a_chain_every_node_is_a_cut_point():
    model = build_model("lenet5", num_classes=10, in_channels=1, image_size=32)
    graph = layer_graph(model, (1, 32, 32), batch_size=4)
    kinds = [n.kind for n in graph.nodes]
    assert kinds[0] == "placeholder" and "Conv2d" in kinds and "Linear" in kinds
    convs = [n for n in graph.nodes if n.kind == "Conv2d"]
    assert convs[0].shape == (4, 6, 28, 28) and convs[0].out_bytes == 4 * 6 * 28 * 28 * 4  # fp32
    assert cut_points(graph) == [n.id for n in graph.nodes[:-1]]
    assert graph.edges == [(i, i + 1) for i in range(len(graph.nodes) - 1)]


def test_a_residual_block_is_cut_only_at_its_ends():
    model = build_model("resnet20", num_classes=10, in_channels=3, image_size=32)
    graph = layer_graph(model, (3, 32, 32))
    cuts = set(cut_points(graph))
    adds = [n for n in graph.nodes if n.kind == "add"]
    assert len(adds) == 9  # three stages of three blocks
    for add in adds:
        start = max(c for c in cuts if c < add.id)  # the block's input: the last cut before its sum
        readers = [n.id for n in graph.nodes if start in n.inputs]
        assert len(readers) == 2  # it feeds both the block's body and its shortcut
        assert add.id + 1 in cuts  # after the sum's ReLU, one tensor again
        assert add.id - start >= 4  # no cut inside: the skip connection is in flight through the block
    body = json.loads(json.dumps(graph.to_dict()))
    assert [e for e in body["edges"]] == [list(e) for e in graph.edges]
    assert [n["id"] for n in body["nodes"]] == list(range(len(graph.nodes)))


def test_a_model_fx_cannot_trace_says_why():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow
                return self.fc(x)
            return self.fc(-x)

    with pytest.raises(Untraceable, match="TraceError|symbolic"):
        layer_graph(Branchy(), (4,))


def test_shared_parameters_count_once():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.b = nn.Linear(8, 8)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    graph = layer_graph(Tied(), (8,))
    assert sum(n.params for n in graph.nodes) == count_params(Tied()) == 64 + 8 + 8


class _Gate(nn.Module):
    """A block with data-dependent control flow (fx cannot trace it) and a residual sum between its modules."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return x + torch.relu(self.bn(self.conv(x))) if x.numel() > 0 else x


def _gated() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), _Gate(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))


def test_the_one_walk_falls_back_to_the_modules_and_every_reader_takes_that_walk():
    """walk(): fx where it can, else one forward through hooks. A Sequential is a chain of its children (a
    composite child holding the leaves it ran); predict prices those leaves, the graph draws the children,
    and the pre-flight memory check counts the same saved bytes as predict, on the meta device."""
    from scaletrain.graph.build import trace
    from scaletrain.perf.footprint import model_memory
    from scaletrain.perf.walk import walk
    from scaletrain.predict.ops import trace_ops

    assert walk(build_model("lenet5", num_classes=10, in_channels=1, image_size=32), (1, 32, 32)).traced_by == "fx"
    g = walk(_gated(), (3, 8, 8), 4)
    assert g.traced_by == "modules" and g.exact and "TraceError" in g.untraceable
    assert [n.name for n in g.nodes[1:-1]] == ["0", "1", "2", "3", "4"]
    assert [p.name for p in g.nodes[3].parts] == ["2.conv", "2.bn"]
    assert [n.name for n in g.leaves() if n.op == "call_module"] == ["0", "1", "2.conv", "2.bn", "3", "4"]
    assert g.nodes[3].in_shapes == [(4, 8, 8, 8)] and g.nodes[3].shape == (4, 8, 8, 8)
    assert sum(n.params for n in g.nodes) == count_params(_gated())
    assert sum(n.flops for n in g.nodes) == 4 * forward_flops(_gated(), (3, 8, 8))  # at batch 4
    assert [n.name for n in trace(_gated(), (3, 8, 8), 4).graph.nodes[1:-1]] == ["0", "1", "2", "3", "4"]
    w = trace_ops(_gated(), (3, 8, 8), 4)
    assert w.traced_by == "hooks" and [op.kind for op in w.ops] == ["conv", "eltwise", "conv", "norm", "view", "linear"]
    with torch.device("meta"):
        meta = walk(_gated(), (3, 8, 8), 4)
        priced = trace_ops(_gated(), (3, 8, 8), 4)
    # autograd's saved bytes on the meta device: the residual sum and the ReLU between modules included
    assert meta.saved_bytes > sum(p.saved_bytes for p in meta.leaves() if p.saved_bytes) > 0
    assert priced.saved_bytes == meta.saved_bytes
    assert sum(b.saved for b in model_memory(_gated, 4, (3, 8, 8), "sgd", "fp32").blocks) == meta.saved_bytes


def test_a_module_walk_of_another_model_is_not_its_dataflow():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = _Gate()
            self.fc = nn.Linear(8 * 8 * 8, 10)

        def forward(self, x):
            return self.fc(self.gate(x).flatten(1))

    from scaletrain.perf.walk import walk

    g = walk(Net(), (8, 8, 8), 2)
    assert g.traced_by == "modules" and not g.exact
    assert [n.name for n in g.nodes[1:-1]] == ["gate.conv", "gate.bn", "fc"]  # its leaf modules, in call order


def test_on_the_meta_device_the_walk_counts_what_training_saves():
    """At a batch above one the meta walk runs in training mode: dropout keeps its mask for backward (in
    evaluation mode it saves nothing), as a training step does."""
    from scaletrain.perf.walk import walk

    with torch.device("meta"):
        plain = walk(nn.Sequential(nn.Linear(64, 64), nn.ReLU()), (64,), 16)
        dropped = walk(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.5)), (64,), 16)
    assert dropped.saved_bytes > plain.saved_bytes


def _walked(graph) -> list[dict]:
    return [dataclasses.asdict(n) for n in graph.nodes]


@pytest.mark.parametrize("name", ["resnet50", "resnet20"])
def test_a_walk_read_off_the_batch_line_is_the_walk_at_that_batch(name):
    """On the meta device a model is walked at the anchors and once more to check the line; every later batch is read
    off it, and is exactly what a walk at that batch gives (shapes, FLOPs, bytes, saved bytes, node by node)."""
    with torch.device("meta"):
        model = build_model(name, num_classes=10, in_channels=3, image_size=64)
    for batch in (5, 2, 3, 7, 64, 256):
        got = layer_graph(model, (3, 64, 64), batch)
        real = walk._layer_graph(model, (3, 64, 64), batch)
        assert got.batch_size == batch and got.saved_bytes == real.saved_bytes
        assert _walked(got) == _walked(real)
    line = walk._BY_BATCH[model][next(iter(walk._BY_BATCH[model]))]
    assert line.checked and line.holds  # (read off the line from the second batch off the anchors on)


class Gram(nn.Module):
    """A model whose cost is not affine in the batch: every sample against every other."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)

    def forward(self, x):
        f = self.conv(x).flatten(1)
        return f @ f.t()


def test_a_model_off_the_line_is_walked_at_every_batch():
    with torch.device("meta"):
        model = Gram()
    for batch in (5, 9):
        got = layer_graph(model, (1, 8, 8), batch)
        assert _walked(got) == _walked(walk._layer_graph(model, (1, 8, 8), batch))
    line = walk._BY_BATCH[model][next(iter(walk._BY_BATCH[model]))]
    assert line.checked and not line.holds
    assert max(n.flops for n in layer_graph(model, (1, 8, 8), 9).nodes) == 2 * 9 * 9 * 72  # (quadratic in the batch)


def test_a_model_changed_in_place_is_walked_anew():
    """The walks kept with a model are keyed by its modules and mode: a layer replaced is another walk."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    before = layer_graph(model, (3, 8, 8), 8)
    with torch.device("meta"):
        model[0] = nn.Conv2d(3, 4, 3, bias=False)
    after = layer_graph(model, (3, 8, 8), 8)
    assert before.nodes[1].params == 4 * 3 * 9 + 4 and after.nodes[1].params == 4 * 3 * 9
