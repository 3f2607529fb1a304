"""A model's layer graph from torch.fx: each node's output shape, parameters, FLOPs and output bytes, the
edges between nodes, and the cut points where exactly one tensor crosses (docs/perf.md).

The base the performance model prices layer by layer and the split of a model into pipeline stages cuts
(only at a cut point can a pipeline cut: every other place has more than one tensor in flight). One
forward pass at batch `batch_size` through fx's interpreter measures shapes and FLOPs, so a model that fx
cannot trace symbolically (data-dependent control flow) raises `Untraceable` with fx's reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.utils.flop_counter import FlopCounterMode

from scaletrain.perf.flops import probe_input
from scaletrain.perf.saved import SavedBytes


class Untraceable(Exception):
    """torch.fx cannot trace the model symbolically; the message says why."""


@dataclass
class Node:
    id: int
    name: str
    op: str  # placeholder, call_module, call_function, call_method, get_attr, output
    kind: str  # the module's class (Conv2d), the function's or method's name (add, flatten)
    target: str  # the module's path in the model (layer1.0.conv1), or the function's name
    shape: tuple[int, ...] | None  # output shape at the traced batch size; None when not one tensor
    params: int = 0  # parameters this node owns (a shared parameter counts at its first node)
    param_bytes: int = 0
    flops: int = 0  # FlopCounterMode's count at the traced batch size (2 per multiply-add; element-wise 0)
    out_bytes: int = 0  # bytes of the output tensor(s)
    # bytes autograd keeps for backward from this node (perf/saved.py: each storage once, parameters not
    # counted); measured when the model is traced on the meta device, else None
    saved_bytes: int | None = None
    inputs: list[int] = field(default_factory=list)  # ids of the nodes whose outputs it reads
    depthwise: bool = False  # a depthwise convolution (groups = input = output channels)


@dataclass
class LayerGraph:
    nodes: list[Node]
    batch_size: int
    traced: fx.GraphModule | None = field(default=None, repr=False)  # fx's module, sharing the model's weights

    @property
    def edges(self) -> list[tuple[int, int]]:
        return [(i, n.id) for n in self.nodes for i in n.inputs]

    def to_dict(self) -> dict[str, Any]:
        """graph.json's form: `nodes` (each with its `id`) and `edges` as [source_id, target_id] pairs."""
        return {"batch_size": self.batch_size, "nodes": [asdict(n) for n in self.nodes],
                "edges": [list(e) for e in self.edges]}


def layer_graph(model: nn.Module, input_shape: tuple[int, ...], batch_size: int = 1) -> LayerGraph:
    """Trace `model` with torch.fx and run one forward pass of zeros of `batch_size` x `input_shape`."""
    try:
        traced = fx.symbolic_trace(model)
    except Exception as e:  # fx raises TraceError, TypeError, ... from inside the user's forward
        raise Untraceable(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    ids = {node: i for i, node in enumerate(traced.graph.nodes)}
    nodes = [Node(ids[n], n.name, n.op, _kind(traced, n), str(n.target), None,
                  inputs=[ids[a] for a in n.all_input_nodes]) for n in traced.graph.nodes]
    _Measure(traced, nodes, ids).run_once(probe_input(model, input_shape, batch_size))
    _count_params(traced, nodes, ids)
    for fx_node in traced.graph.nodes:
        if fx_node.op == "call_module":
            m = traced.get_submodule(fx_node.target)
            nodes[ids[fx_node]].depthwise = (isinstance(m, nn.Conv2d) and m.groups > 1
                                             and m.groups == m.in_channels == m.out_channels)
    return LayerGraph(nodes, batch_size, traced)


def cut_points(graph: LayerGraph) -> list[int]:
    """Ids of the nodes after which (in the traced order) exactly one tensor is in flight: that node's
    output, read by what follows and by nothing before it. The output node is not a cut point."""
    last_use = {}
    for n in graph.nodes:
        for i in n.inputs:
            last_use[i] = max(last_use.get(i, -1), n.id)
    cuts = []
    for n in graph.nodes[:-1]:
        live = [i for i, end in last_use.items() if i <= n.id < end]  # produced by now, still to be read
        if live == [n.id] and n.op != "get_attr":
            cuts.append(n.id)
    return cuts


def _kind(traced: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_module":
        return type(traced.get_submodule(node.target)).__name__
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    return str(node.target) if node.op == "call_method" else node.op


def _count_params(traced: fx.GraphModule, nodes: list[Node], ids: dict) -> None:
    seen: set[int] = set()
    for fx_node in traced.graph.nodes:
        if fx_node.op == "call_module":
            tensors = list(traced.get_submodule(fx_node.target).parameters())
        elif fx_node.op == "get_attr":
            value = _attr(traced, fx_node.target)
            tensors = [value] if isinstance(value, nn.Parameter) else []
        else:
            continue
        node = nodes[ids[fx_node]]
        for p in tensors:
            if id(p) not in seen:
                seen.add(id(p))
                node.params += p.numel()
                node.param_bytes += p.numel() * p.element_size()


def _attr(traced: fx.GraphModule, target: str) -> Any:
    value: Any = traced
    for part in target.split("."):
        value = getattr(value, part)
    return value


class _Measure(fx.Interpreter):
    """Runs the traced graph node by node, recording each node's output shape, bytes and FLOPs."""

    def __init__(self, traced: fx.GraphModule, nodes: list[Node], ids: dict) -> None:
        super().__init__(traced)
        self.nodes, self.ids = nodes, ids

    def run_once(self, x: torch.Tensor) -> None:
        was_training = self.module.training
        self.module.eval()  # as forward_flops: train-mode BN rejects a batch of one with 1x1 maps
        # on meta tensors autograd's saved tensors cost nothing: count them (elsewhere they would be allocated)
        self.saved = SavedBytes(self.module) if x.device.type == "meta" else None
        try:
            with self.saved or torch.no_grad():
                self.run(x)
        finally:
            self.module.train(was_training)

    def run_node(self, n: fx.Node) -> Any:
        before = self.saved.total if self.saved else 0
        with FlopCounterMode(display=False) as counter:
            out = super().run_node(n)
        node = self.nodes[self.ids[n]]
        if self.saved:
            node.saved_bytes = self.saved.total - before
        node.flops = int(counter.get_total_flops())
        tensors = _tensors(out)
        node.out_bytes = sum(t.numel() * t.element_size() for t in tensors)
        node.shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
        return out


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []
