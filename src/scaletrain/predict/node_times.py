"""Predicted seconds of each node of a model's graph, from a calibration (docs/graph.md; the performance
model is docs/predict.md).

A node's time is its op's calibrated time (a measured shape looked up, any other from the fitted laws)
times its group's loop factor (what a real training step adds to an op timed alone), by default for one
process on the calibrated thread count nearest the machine's cores: the forward and backward phases of a
one-process prediction, node by node, without the loss. A block's time is the sum of its nodes'.

The loop factors must be the ones calibrated with the threads the ops are priced at: a factor is a real
step's phase over its ops' laws at that run's threads. A pipeline's stage runs at cores / ranks threads
beside the other ranks, so its blocks take the factors of the calibration's runs on as many ranks; the
factors of one rank at all cores put on one-thread laws priced resnet20's blocks at 1.2-1.4x (forward)
and 1.8-2.1x (backward) what its stages took in a pipeline run (docs/predict.md, Pipelines and FSDP).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from scaletrain.perf.blocks import Block
from scaletrain.perf.walk import LayerGraph
from scaletrain.predict.kept import Kept

Times = tuple[float, float]  # (forward seconds, backward seconds)


def node_times(model: nn.Module, input_shape: tuple[int, ...], batch: int, calibration: dict[str, Any] | None,
               precision: str = "fp32", threads: int | None = None, ranks: int | None = None,
               predictor: Any = None, graph: LayerGraph | None = None) -> dict[str, Times]:
    """{op name: (forward s, backward s)} at `batch`: the fx node's name, or, for a model fx cannot trace,
    its leaf modules' qualified names (a module called twice: its calls summed). Priced by `predictor` (a point's
    basis: predict/predictor.py or predict/datasheet.py) where given, else by a Predictor of `calibration`.
    `threads` defaults to the basis's cores; `ranks`, the processes sharing the node (whose loop factors apply), to
    as many as the cores hold at `threads` each. `graph`: the model's walk at `input_shape` and `batch` where one
    has been made (else it is walked)."""
    source = predictor if predictor is not None else calibration
    return _KEPT.get((model, source), (tuple(input_shape), batch, precision, threads, ranks),
                     lambda: _node_times(model, tuple(input_shape), batch, source, precision, threads, ranks, graph))


_KEPT = Kept(64)
"""node_times by model, shape, batch, basis and setting: a plan splits one model at many settings (the model and
the calibration or predictor held with their result, so the ids in the key stay theirs)."""


def _node_times(model: nn.Module, input_shape: tuple[int, ...], batch: int, source: Any,
                precision: str, threads: int | None, ranks: int | None, graph: LayerGraph | None) -> dict[str, Times]:
    from scaletrain.predict.ops import trace_ops, workload_of
    from scaletrain.predict.predictor import Predictor

    if graph is not None and graph.batch_size == batch and graph.traced_by == "fx":
        workload = workload_of(model, graph, tuple(input_shape))
    else:
        workload = trace_ops(model, tuple(input_shape), batch)
    if isinstance(source, dict):
        source = Predictor(source, {"intra": (source.get("network") or {}).get("fits") or {}, "inter": None})
    cores = source.cores
    threads = threads or cores
    costs = source.op_costs(workload, precision, threads)
    loop = source.loop(local_ranks=ranks or max(1, cores // threads))
    out: dict[str, Times] = {}
    for op, cost in zip(workload.ops, costs):
        f, b = out.get(op.name, (0.0, 0.0))
        out[op.name] = (f + loop.op_s(cost, "forward"), b + loop.op_s(cost, "backward"))
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
