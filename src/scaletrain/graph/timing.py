"""Predicted seconds of each node of a model's graph, from a calibration (docs/graph.md; the performance
model is docs/predict.md).

A node's time is its op's calibrated time (a measured shape looked up, any other from the fitted laws)
times its group's loop factor (what a real training step adds to an op timed alone), for one process on
the calibrated thread count nearest the machine's cores: the forward and backward phases of a one-process
prediction, node by node, without the loss. A block's time is the sum of its nodes'.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from scaletrain.perf.blocks import Block
from scaletrain.perf.graph import LayerGraph

Times = tuple[float, float]  # (forward seconds, backward seconds)


def node_times(model: nn.Module, input_shape: tuple[int, ...], batch: int, calibration: dict[str, Any],
               precision: str = "fp32", threads: int | None = None) -> dict[str, Times]:
    """{op name: (forward s, backward s)} at `batch`: the fx node's name, or, for a model fx cannot trace,
    its leaf modules' qualified names (a module called twice: its calls summed). `threads` defaults to the
    calibrated machine's cores."""
    from scaletrain.predict.ops import trace_ops
    from scaletrain.predict.predictor import Predictor

    workload = trace_ops(model, tuple(input_shape), batch)
    network = {"intra": (calibration.get("network") or {}).get("fits") or {}, "inter": None}
    predictor = Predictor(calibration, network)
    costs = predictor.op_costs(workload, precision, threads or calibration["device"]["cores"])
    loop = predictor.loop(local_ranks=1)
    out: dict[str, Times] = {}
    for op, cost in zip(workload.ops, costs):
        f, b = out.get(op.name, (0.0, 0.0))
        out[op.name] = (f + cost.forward_s * loop.factor(cost.group, "forward"),
                        b + cost.backward_s * loop.factor(cost.group, "backward"))
    return out


def layer_times(graph: LayerGraph, times: dict[str, Times]) -> dict[int, Times]:
    """{node id: times} of the graph's nodes: an fx node's by its name; in a graph walked module by module
    (`traced` None), the sum over the leaf modules inside each node's module."""
    out: dict[int, Times] = {}
    for n in graph.nodes:
        if n.name in times:
            out[n.id] = times[n.name]
        elif graph.traced is None and n.op == "call_module":
            inside = [t for name, t in times.items() if name.startswith(n.target + ".")]
            out[n.id] = (sum(f for f, _ in inside), sum(b for _, b in inside))
    return out


def block_times(blocks: list[Block], graph: LayerGraph, times: dict[str, Times]) -> list[Times]:
    """Each block's (forward s, backward s): the sum of its nodes'."""
    per_node = layer_times(graph, times)
    return [(sum(per_node.get(i, (0.0, 0.0))[0] for i in b.nodes), sum(per_node.get(i, (0.0, 0.0))[1] for i in b.nodes))
            for b in blocks]
