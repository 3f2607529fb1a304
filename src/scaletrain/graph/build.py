"""The data behind `scaletrain graph`: a model's layer graph (torch.fx, or its children in order for an
nn.Sequential fx cannot trace), grouped at one level, as graph.json's dict (docs/graph.md). No printing,
no drawing: dot.py, picture.py and cli.py render what `document` returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from scaletrain.errors import UserError
from scaletrain.perf.blocks import Block
from scaletrain.perf.walk import LayerGraph, walk_or_explain

FORMAT = 1
KIND = "scaletrain-graph"


@dataclass
class Traced:
    graph: LayerGraph
    traced_by: str  # "fx", or "module order" (an nn.Sequential fx cannot trace: its children run in order)
    note: str | None = None  # one line saying why fx was not used


def trace(model: nn.Module, input_shape: tuple[int, ...], batch_size: int, label: str = "the model") -> Traced:
    """`model`'s layer graph at `batch_size` (perf/walk.walk): fx first, module order for a Sequential fx cannot
    trace. Any other model fx cannot trace, or a forward that fails, is a one-line UserError."""
    graph = walk_or_explain(model, input_shape, batch_size, label)
    if graph.traced_by == "fx":
        return Traced(graph, "fx")
    if not graph.exact:
        raise UserError(
            f"torch.fx cannot trace {label} ({graph.untraceable}): make its forward traceable (no control flow that "
            "depends on tensor values, such as `if x.sum() > 0`; or move such code into a leaf module fx does not "
            "enter), or build it as an nn.Sequential, whose children can be taken in order")
    note = (f"torch.fx cannot trace {label} ({graph.untraceable}): its children are taken in the order the "
            "nn.Sequential runs them, each one node")
    return Traced(graph, "module order", note)


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
