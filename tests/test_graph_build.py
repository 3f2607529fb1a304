"""graph/build.py: fx first, module order for a Sequential fx cannot trace (its shapes, parameters and FLOPs
as fx would give them), a one-line refusal for any other model fx cannot trace, and graph.json's dict."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from scaletrain.errors import UserError
from scaletrain.graph.build import document, trace
from scaletrain.perf.walk import module_graph
from scaletrain.perf.blocks import group
from scaletrain.perf.flops import count_params, forward_flops


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x) if x.numel() > 0 else x  # a tensor-valued condition: fx cannot trace it


def gated() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), Gate(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10))


def test_a_traceable_model_is_traced_by_fx():
    t = trace(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (4,), 2)
    assert t.traced_by == "fx" and t.note is None and t.graph.traced is not None


def test_a_sequential_fx_cannot_trace_is_taken_in_module_order():
    model = gated()
    t = trace(model, (3, 8, 8), 2, label="gated")
    assert t.traced_by == "module order" and t.graph.traced is None
    assert "torch.fx cannot trace gated" in t.note and "\n" not in t.note
    nodes = t.graph.nodes
    assert [n.op for n in nodes] == ["placeholder"] + ["call_module"] * 5 + ["output"]
    assert [n.name for n in nodes[1:-1]] == ["0", "1", "2", "3", "4"]
    assert [n.kind for n in nodes[1:-1]] == ["Conv2d", "ReLU", "Gate", "Flatten", "Linear"]
    assert t.graph.edges == [(i, i + 1) for i in range(6)]
    assert nodes[3].shape == (2, 4, 8, 8) and nodes[5].shape == (2, 10)
    assert sum(n.flops for n in nodes) == 2 * forward_flops(model, (3, 8, 8))
    assert sum(n.params for n in nodes) == count_params(model)
    assert model.training  # its mode is given back
    blocks = group(t.graph, "block")
    assert [b.name for b in blocks] == ["0-1", "2-3", "4"]


def test_module_order_counts_a_shared_parameter_once():
    lin = nn.Linear(4, 4)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    graph = module_graph(model, (4,), 1, "untraceable")
    assert [n.params for n in graph.nodes[1:-1]] == [20, 0, 0]


def test_any_other_model_fx_cannot_trace_is_one_line_naming_the_reason_and_the_fix():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = Gate()

        def forward(self, x):
            return self.gate(x)

    with pytest.raises(UserError) as e:
        trace(Net(), (4, 8, 8), 2, label="mypkg:net")
    text = str(e.value)
    assert "torch.fx cannot trace mypkg:net" in text and "TraceError" in text
    assert "make its forward traceable" in text and "\n" not in text


def test_a_forward_that_fails_is_one_line():
    with pytest.raises(UserError, match="fails on a batch of 2x3x8x8"):
        trace(nn.Sequential(nn.Flatten(), nn.Linear(7, 2)), (3, 8, 8), 2)
    with pytest.raises(UserError, match="fails on a batch of 2x3x8x8"):
        trace(nn.Sequential(nn.Flatten(), Gate()), (3, 8, 8), 2)  # in module order too


def test_the_document_holds_nodes_edges_cuts_and_totals():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    t = trace(model, (3, 8, 8), 2)
    blocks = group(t.graph, "layer")
    doc = json.loads(json.dumps(document("m:f", "layer", (3, 8, 8), t, blocks)))
    assert doc["kind"] == "scaletrain-graph" and doc["level"] == "layer" and doc["batch_size"] == 2
    assert doc["input_shape"] == [3, 8, 8] and doc["traced_by"] == "fx" and doc["notes"] == []
    assert [n["id"] for n in doc["nodes"]] == [0, 1, 2, 3]
    assert doc["edges"] == [[0, 1], [1, 2], [2, 3]] and doc["cut_points"] == [0, 1, 2]
    assert [n["out_shape"] for n in doc["nodes"]] == [[2, 4, 6, 6], [2, 4, 6, 6], [2, 144], [2, 2]]
    assert all(n["forward_s"] is None and n["backward_s"] is None for n in doc["nodes"])
    assert doc["totals"]["params"] == count_params(model) and doc["totals"]["forward_s"] is None
    assert doc["totals"]["flops"] == 2 * forward_flops(model, (3, 8, 8))

    timed = document("m:f", "layer", (3, 8, 8), t, blocks, [(1.0, 2.0)] * 4, "cal.json")
    assert [n["forward_s"] for n in timed["nodes"]] == [1.0] * 4
    assert timed["totals"]["forward_s"] == 4.0 and timed["totals"]["backward_s"] == 8.0
    assert timed["times_from"] == "cal.json"


def test_tracing_leaves_the_weights_alone():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trace(model, (3, 8, 8), 4)
    module_graph(model, (3, 8, 8), 4, "untraceable")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # eval: BN statistics kept
