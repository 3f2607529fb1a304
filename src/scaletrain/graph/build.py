"""The data behind `scaletrain graph`: a model's layer graph (torch.fx, or its children in order for an
nn.Sequential fx cannot trace), grouped at one level, as graph.json's dict (docs/graph.md). No printing,
no drawing: dot.py, picture.py and cli.py render what `document` returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from scaletrain.errors import UserError
from scaletrain.perf.blocks import Block
from scaletrain.perf.footprint import out_of_memory
from scaletrain.perf.flops import probe_input
from scaletrain.perf.graph import LayerGraph, Node, Untraceable, layer_graph

FORMAT = 1
KIND = "scaletrain-graph"


@dataclass
class Traced:
    graph: LayerGraph
    traced_by: str  # "fx", or "module order" (an nn.Sequential fx cannot trace: its children run in order)
    note: str | None = None  # one line saying why fx was not used


def trace(model: nn.Module, input_shape: tuple[int, ...], batch_size: int, label: str = "the model") -> Traced:
    """`model`'s layer graph at `batch_size`; fx first, module order for a Sequential fx cannot trace.
    Any other model fx cannot trace, or a forward that fails, is a one-line UserError."""
    shape = "x".join(str(d) for d in (batch_size, *input_shape))
    try:
        try:
            return Traced(layer_graph(model, input_shape, batch_size), "fx")
        except Untraceable as e:
            if not isinstance(model, nn.Sequential):
                raise UserError(
                    f"torch.fx cannot trace {label} ({e}): make its forward traceable (no control flow that "
                    "depends on tensor values, such as `if x.sum() > 0`; or move such code into a leaf module "
                    "fx does not enter), or build it as an nn.Sequential, whose children can be taken in order"
                ) from None
            note = (f"torch.fx cannot trace {label} ({e}): its children are taken in the order the "
                    "nn.Sequential runs them, each one node")
            return Traced(module_order(model, input_shape, batch_size), "module order", note)
    except UserError:
        raise
    except Exception as e:  # the forward itself fails on a batch of this shape
        first = str(e).splitlines()[0] if str(e) else ""
        if out_of_memory(e):
            raise UserError(f"tracing {label} on a batch of {shape} ran out of memory here ({first}): lower "
                            "--batch-size or --image-size") from None
        raise UserError(f"the forward of {label} fails on a batch of {shape} ({type(e).__name__}: {first}): "
                        "fix the model, or its --image-size / --in-channels") from None


def module_order(model: nn.Sequential, input_shape: tuple[int, ...], batch_size: int) -> LayerGraph:
    """A chain: the input, each child of the Sequential as one node (its output shape, parameters, FLOPs),
    the output. Sound for a Sequential alone: its forward is its children in order."""
    children = list(model._modules.items())  # what Sequential.forward runs; named_children() drops repeats
    nodes = [Node(0, "input", "placeholder", "placeholder", "x", None)]
    for i, (name, child) in enumerate(children, start=1):
        nodes.append(Node(i, name, "call_module", type(child).__name__, name, None, inputs=[i - 1],
                          depthwise=isinstance(child, nn.Conv2d) and child.groups > 1
                          and child.groups == child.in_channels == child.out_channels))
    nodes.append(Node(len(children) + 1, "output", "output", "output", "output", None, inputs=[len(children)]))
    seen: set[int] = set()
    for node, (_, child) in zip(nodes[1:], children):
        for p in child.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                node.params += p.numel()
                node.param_bytes += p.numel() * p.element_size()
    x = probe_input(model, input_shape, batch_size)
    nodes[0].shape, nodes[0].out_bytes = tuple(x.shape), x.numel() * x.element_size()
    was_training = model.training
    model.eval()  # as perf.graph: train-mode BN rejects a batch of one with 1x1 maps
    try:
        with torch.no_grad():
            for node, (_, child) in zip(nodes[1:], children):
                with FlopCounterMode(display=False) as counter:
                    x = child(x)
                node.flops = int(counter.get_total_flops())
                node.shape = tuple(x.shape) if isinstance(x, torch.Tensor) else None
                node.out_bytes = x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0
    finally:
        model.train(was_training)
    return LayerGraph(nodes, batch_size, None)


def document(model: str, level: str, input_shape: tuple[int, ...], traced: Traced, blocks: list[Block],
             times: list[tuple[float, float]] | None = None, times_from: str | None = None,
             precision: str = "fp32") -> dict[str, Any]:
    """graph.json: the blocks at `level` as nodes (with their predicted seconds when `times` is given, one
    (forward, backward) per block), the edges between them, the cut points and the totals."""
    nodes = []
    for i, b in enumerate(blocks):
        d = b.to_dict()
        d["forward_s"], d["backward_s"] = times[i] if times is not None else (None, None)
        nodes.append(d)
    edges = [[src, b.id] for b in blocks for src in b.inputs]
    cuts = [b.id for b in blocks if b.cut_after]
    notes = [traced.note] if traced.note else []

    def total(key: str) -> float | None:
        return None if times is None else sum(n[key] for n in nodes)

    return {"format": FORMAT, "kind": KIND, "model": model, "level": level, "batch_size": traced.graph.batch_size,
            "input_shape": list(input_shape), "traced_by": traced.traced_by, "precision": precision,
            "times_from": times_from, "notes": notes, "nodes": nodes, "edges": edges, "cut_points": cuts,
            "totals": {"nodes": len(nodes), "edges": len(edges), "cut_points": len(cuts),
                       "params": sum(b.params for b in blocks), "param_bytes": sum(b.param_bytes for b in blocks),
                       "flops": sum(b.flops for b in blocks), "saved_bytes": sum(b.saved_bytes for b in blocks),
                       "forward_s": total("forward_s"), "backward_s": total("backward_s")}}
