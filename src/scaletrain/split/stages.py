"""The modules of a model's pipeline stages: contiguous runs of its blocks (perf/blocks.py), each a
torch.fx GraphModule taking the one tensor that crosses the cut before it and returning the one that
crosses the cut after it. They share the model's parameters and buffers (no copy): a stage's update is
the model's update, and the model's state_dict holds every stage's weights.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from torch import fx, nn

from scaletrain.errors import UserError
from scaletrain.perf.blocks import Block, group
from scaletrain.perf.walk import LayerGraph, Untraceable, layer_graph, on_meta

Bounds = list[tuple[int, int]]  # per stage: (first block, one past its last block)


@dataclass
class Blocked:
    """A model's block-level graph: what a split cuts."""

    graph: LayerGraph
    blocks: list[Block]
    root: nn.Module | None = None
    """The module whose layers the stages' modules run (default: fx's module of the graph, sharing the model's)."""

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.blocks]


def blocked(model: nn.Module, input_shape: tuple[int, ...], batch_size: int = 1, meta: bool = False) -> Blocked:
    """The block graph of `model` at `batch_size` x `input_shape`; a model fx cannot trace is refused. `meta`: the
    shapes, bytes and FLOPs from a copy of the model on the meta device (no memory, whatever the image's size;
    the stages' modules still run `model`'s layers), else from a forward of zeros through `model`."""
    try:
        if meta:  # (a model already on the meta device is walked as it is: its walks at other batches kept)
            graph = layer_graph(model if on_meta(model) else copy.deepcopy(model).to("meta"), input_shape, batch_size)
            return Blocked(graph, group(graph, "block"), root=model)
        graph = layer_graph(model, input_shape, batch_size)
    except Untraceable as e:
        raise UserError(f"torch.fx cannot trace the model ({e}), so it cannot be split into pipeline stages: "
                        "make its forward traceable (no data-dependent control flow)") from None
    return Blocked(graph, group(graph, "block"))


def check_bounds(bounds: Bounds, blocks: int) -> None:
    """Bounds must cover 0..blocks contiguously with no empty stage."""
    if not bounds or bounds[0][0] != 0 or bounds[-1][1] != blocks or any(
            lo >= hi for lo, hi in bounds) or any(a[1] != b[0] for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"stage bounds {bounds} do not cover blocks 0..{blocks} contiguously")


def stage_module(b: Blocked, lo: int, hi: int) -> fx.GraphModule:
    """The module computing blocks lo..hi-1: input the tensor crossing into block lo (the model's input
    for lo = 0), output the tensor leaving block hi-1 (the model's output for the last block)."""
    traced = b.graph.traced
    assert traced is not None
    by_id = {n.id: n for n in b.graph.nodes}
    members = {i for blk in b.blocks[lo:hi] for i in blk.nodes}
    fx_nodes = list(traced.graph.nodes)
    first_id = min(members)
    if lo == 0:
        entry = next(n for n in fx_nodes if n.op == "placeholder")
    else:
        entry = fx_nodes[b.blocks[lo - 1].nodes[-1]]
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {entry: graph.placeholder("x")}

    def arg(n: fx.Node) -> fx.Node:
        if n not in env:
            if n.op != "get_attr":
                raise ValueError(f"block {b.blocks[lo].name}: node {n.name} is read across the cut at "
                                 f"{by_id[first_id].name}")
            env[n] = graph.node_copy(n, arg)
        return env[n]

    for i, n in enumerate(fx_nodes):
        if i in members:
            env[n] = graph.node_copy(n, arg)
    last = fx_nodes[b.blocks[hi - 1].nodes[-1]]
    graph.output(env[last])
    module = fx.GraphModule(b.root if b.root is not None else traced, graph, class_name=f"Stage_{lo}_{hi}")
    return module


def block_pieces(b: Blocked, lo: int, hi: int) -> list[tuple[list[str], fx.GraphModule]]:
    """Blocks lo..hi-1 as consecutive modules, one per run of blocks ending where one tensor crosses (every
    block of a residual network), each with its blocks' names: what activation checkpointing recomputes."""
    pieces, start = [], lo
    for k in range(lo, hi):
        if k == hi - 1 or b.blocks[k].cut_after:
            pieces.append(([blk.name for blk in b.blocks[start:k + 1]], stage_module(b, start, k + 1)))
            start = k + 1
    return pieces


def stage_modules(b: Blocked, bounds: Bounds) -> list[fx.GraphModule]:
    check_bounds(bounds, len(b.blocks))
    return [stage_module(b, lo, hi) for lo, hi in bounds]
