"""A layer graph (perf/walk.py) grouped at one of three levels: layer, block or module (docs/graph.md).

    layer    every node that computes (placeholders, the output and attribute reads left out)
    block    the single-entry/single-exit regions between consecutive cut points: a residual block, an
             inception module; a region without FLOPs (an activation, a pooling, a flatten) joins the
             block before it, and a depthwise convolution joins the pointwise one after it
    module   the model's top-level children in the order they run (functions join the module before)

At the block level a pipeline may cut between any two consecutive blocks (`cut_after` is true for all
but the last); at the other levels only where `cut_after` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scaletrain.perf.walk import LayerGraph, Node, cut_points

LEVELS = ("layer", "block", "module")
_SKIP = ("placeholder", "output", "get_attr")


@dataclass
class Block:
    id: int
    name: str  # the module path its layers share ("layer1.0", "features.0-3", "layer3.2+pool"): _names
    nodes: list[int]  # the layer graph's node ids in it, in traced order
    kinds: list[str]  # the kinds of its layers (Conv2d, BatchNorm2d, add, ...), in order
    params: int = 0
    param_bytes: int = 0
    flops: int = 0  # forward FLOPs at the graph's batch size
    out_shape: tuple[int, ...] | None = None  # its last layer's output (the tensor crossing a cut after it)
    out_bytes: int = 0
    saved_bytes: int = 0  # bytes of its layers' outputs (what autograd may keep for backward), views left out
    inputs: list[int] = field(default_factory=list)  # ids of the blocks whose outputs it reads
    cut_after: bool = False  # exactly one tensor crosses after it: a pipeline may cut here

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "nodes": self.nodes, "kinds": self.kinds, "params": self.params,
                "param_bytes": self.param_bytes, "flops": self.flops,
                "out_shape": list(self.out_shape) if self.out_shape is not None else None,
                "out_bytes": self.out_bytes, "saved_bytes": self.saved_bytes, "inputs": self.inputs,
                "cut_after": self.cut_after}


def group(graph: LayerGraph, level: str = "block") -> list[Block]:
    """The graph's nodes grouped at `level` (one of LEVELS), in traced order, with the edges between groups."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, not {level!r}")
    nodes = [n for n in graph.nodes if n.op not in _SKIP]
    if level == "layer":
        members = [[n.id] for n in nodes]
    elif level == "module":
        members = _by_module(nodes)
    else:
        members = _by_cuts(graph, nodes)
    return _blocks(graph, members)


def _by_cuts(graph: LayerGraph, nodes: list[Node]) -> list[list[int]]:
    cuts = set(cut_points(graph))
    segments: list[list[int]] = []
    current: list[int] = []
    for n in nodes:
        current.append(n.id)
        if n.id in cuts:
            segments.append(current)
            current = []
    if current:
        segments.append(current)
    by_id = {n.id: n for n in graph.nodes}
    merged: list[list[int]] = []
    carry: list[int] = []  # a leading region without FLOPs, or a depthwise convolution: joins the next
    for seg in segments:
        seg = carry + seg
        carry = []
        flops = sum(by_id[i].flops for i in seg)
        if flops == 0:
            if merged:
                merged[-1] += seg
            else:
                carry = seg
            continue
        if _depthwise_only(seg, by_id):
            carry = seg
            continue
        merged.append(seg)
    if carry:
        if merged:
            merged[-1] += carry
        else:
            merged.append(carry)
    return merged


def _depthwise_only(seg: list[int], by_id: dict[int, Node]) -> bool:
    """Its only FLOPs come from depthwise convolutions (groups = channels), recorded by perf.walk as kind
    Conv2d with `depthwise` set."""
    computing = [by_id[i] for i in seg if by_id[i].flops > 0]
    return bool(computing) and all(getattr(n, "depthwise", False) for n in computing)


def _by_module(nodes: list[Node]) -> list[list[int]]:
    groups: list[list[int]] = []
    keys: list[str] = []
    for n in nodes:
        key = n.target.split(".")[0] if n.op == "call_module" else None
        if groups and (key is None or key == keys[-1]):
            groups[-1].append(n.id)
        else:
            groups.append([n.id])
            keys.append(key or n.name)
    return groups


def _blocks(graph: LayerGraph, members: list[list[int]]) -> list[Block]:
    by_id = {n.id: n for n in graph.nodes}
    owner = {i: b for b, ids in enumerate(members) for i in ids}
    cuts = set(cut_points(graph))
    names = _names(members, by_id)
    out = []
    for b, ids in enumerate(members):
        layers = [by_id[i] for i in ids]
        last = layers[-1]
        inputs = sorted({owner[i] for n in layers for i in n.inputs if i in owner and owner[i] != b})
        out.append(Block(
            id=b, name=names[b], nodes=list(ids), kinds=[n.kind for n in layers],
            params=sum(n.params for n in layers), param_bytes=sum(n.param_bytes for n in layers),
            flops=sum(n.flops for n in layers), out_shape=last.shape, out_bytes=last.out_bytes,
            saved_bytes=_saved(layers), inputs=inputs,
            cut_after=last.id in cuts and b < len(members) - 1))
    return out


def _saved(layers: list[Node]) -> int:
    """Bytes the block keeps for backward: as autograd saves them where the trace counted them (meta), else
    every output but views'."""
    if all(n.saved_bytes is not None for n in layers):
        return sum(n.saved_bytes for n in layers)
    return sum(n.out_bytes for n in layers if not _is_view(n))


_VIEWS = ("flatten", "view", "reshape", "size", "getattr", "Flatten", "Identity", "squeeze", "unsqueeze",
          "permute", "transpose", "contiguous", "dim", "getitem")


def _is_view(n: Node) -> bool:
    return n.kind in _VIEWS


def _names(members: list[list[int]], by_id: dict[int, Node]) -> list[str]:
    """Each group's name: the module path its layers share ("layer1.0"), with the range of children it
    covers when other groups hold layers of the same module ("features.0-3", or "3-5" of a Sequential
    model); layers of several top-level modules join their names ("layer3.2+pool"; first..last beyond
    four); functions alone, their node names."""
    paths = [[by_id[i].target.split(".") for i in ids if by_id[i].op == "call_module"] for ids in members]
    names = []
    for b, ids in enumerate(members):
        if not paths[b]:
            first, last = by_id[ids[0]].name, by_id[ids[-1]].name
            names.append(first if len(ids) == 1 else f"{first}..{last}")
            continue
        others = [p for g, group in enumerate(paths) if g != b for p in group]
        runs: list[list[list[str]]] = []
        for p in paths[b]:  # consecutive layers of one top-level module (or of a Sequential model's children)
            if runs and (runs[-1][0][0] == p[0] or runs[-1][0][0].isdigit() and p[0].isdigit()):
                runs[-1].append(p)
            else:
                runs.append([p])
        parts = [_describe(run, others) for run in runs]
        names.append("+".join(parts) if len(parts) <= 4 else f"{parts[0]}..{parts[-1]}")
    return names


def _describe(paths: list[list[str]], others: list[list[str]]) -> str:
    common = paths[0]
    for p in paths[1:]:
        k = 0
        while k < min(len(common), len(p)) and common[k] == p[k]:
            k += 1
        common = common[:k]
    name = ".".join(common)
    below = [p[len(common)] for p in paths if len(p) > len(common)]
    if below and any(o[:len(common)] == common for o in others):  # part of a module other groups share
        span = below[0] if below[0] == below[-1] else f"{below[0]}-{below[-1]}"
        name = f"{name}.{span}" if name else span
    return name
