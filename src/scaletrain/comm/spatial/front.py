"""The tiled front of a model: every layer up to the end of the module `--spatial-until` names runs on tiles,
that module's output is gathered into the whole image on every rank of the tiles, and the rest of the model
runs on it unchanged.

The front is read from torch.fx's graph of the model (perf/walk.layer_graph, on the meta device): in order, up to
the last node of the boundary module, every node must have a tiled version (comm/spatial/layers.py) or act on
each pixel alone, and the boundary must be a cut point (no other tensor flows past it: a skip connection
crossing it would reach the rest of the model as a tile). Anything else is refused with one line naming the
layer, before any process starts.
"""

from __future__ import annotations

import copy
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from scaletrain.comm.spatial.geometry import TileGrid, check_side, square_grid
from scaletrain.comm.spatial.halo import H, Tiles, gather
from scaletrain.comm.spatial.layers import POINTWISE, SPATIAL, tiled, windows_of
from scaletrain.errors import UserError
from scaletrain.perf.walk import LayerGraph, Node, Untraceable, cut_points, layer_graph

PIXELWISE = {"add", "add_", "iadd", "mul", "mul_", "imul", "sub", "relu", "relu_", "sigmoid", "tanh", "gelu",
             "silu", "hardswish", "leaky_relu", "dropout", "contiguous"}
"""Functions and tensor methods (fx node kinds) that act on each pixel alone: they run on a tile unchanged."""


@dataclass(frozen=True)
class Front:
    layers: tuple[str, ...]
    """The module paths of the leaf layers that run on tiles (pointwise ones aside), in order."""
    until: str
    """The module whose output is gathered."""
    inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """Each window layer of the front (conv, pool) and its input's shape for one whole sample (C, H, W)."""
    last: str = ""
    """The fx node name of the front's last node (where the gather is)."""
    out_shape: tuple[int, ...] = ()
    """The gathered tensor's shape for one whole sample (C, H, W)."""
    on_image: tuple[str, ...] = ()
    """The window layers whose input depends on no parameter (the image, or weightless layers on it): no gradient
    flows back through them, so their backward exchanges no halo gradient."""
    stems: tuple[tuple[str, str, str, str], ...] = ()
    """Convolution, BatchNorm, ReLU and max pooling in a row that run fused (comm/spatial/stem.py): each output read
    by the next alone, each module called once."""

    def fused_pools(self) -> frozenset[str]:
        """The pooling layers of fused stems: their forward (and its halos) runs again in their backward."""
        return frozenset(chain[3] for chain in self.stems)


KEPT = 32
_kept: OrderedDict = OrderedDict()


def _keep(what: str, model: nn.Module, sample_shape: tuple[int, ...], args: tuple, make: Callable):
    """`make()` kept for the next call on the same model (its class and its modules' repr) and shape with the same
    `args`, its UserError too: a plan asks for the front of one model at every candidate, and a walk of a
    ResNet-50 takes 0.3 s."""
    key = (what, type(model), _described(model), tuple(sample_shape), args)
    if key not in _kept:
        try:
            _kept[key] = make()
        except UserError as e:
            _kept[key] = e
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
    _kept.move_to_end(key)
    if isinstance(_kept[key], UserError):
        raise UserError(str(_kept[key])) from None
    return _kept[key]


def _described(model: nn.Module) -> str:
    """repr(model), kept per model object (a ResNet-50's takes milliseconds, and a plan asks at every candidate)."""
    if model not in _reprs:
        _reprs[model] = repr(model)
    return _reprs[model]


_reprs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _graph(model: nn.Module, sample_shape: tuple[int, ...]) -> LayerGraph:
    """fx's graph of the model on the meta device (tracing a large image takes no memory), at batch 1: the model
    itself where it is on meta, else a copy of it; kept (_keep)."""
    def walked() -> LayerGraph:
        on_meta = all(t.is_meta for t in (*model.parameters(), *model.buffers()))
        try:
            return layer_graph(model if on_meta else copy.deepcopy(model).to("meta"), sample_shape, 1)
        except Untraceable as e:
            raise UserError(f"torch.fx cannot trace the model ({e}), so its front cannot be tiled: make its "
                            "forward traceable (no data-dependent control flow)") from None

    return _keep("graph", model, sample_shape, (), walked)


def blocked_on_meta(model: nn.Module, sample_shape: tuple[int, ...]):
    """split/stages.blocked(model, shape, 1, meta=True) from the same kept graph; kept itself (its grouping finds the
    cut points, quadratic in the graph's nodes: a plan asks at every memory estimate of tiles in stages)."""
    from scaletrain.split.stages import Blocked, group

    def blocked() -> Blocked:
        graph = _graph(model, sample_shape)
        return Blocked(graph, group(graph, "block"), root=model)

    return _keep("blocked", model, sample_shape, (), blocked)


def _why_not(model: nn.Module, node: Node, graph: LayerGraph) -> str | None:
    """Why this node cannot run on a tile (None: it can)."""
    if node.op in ("placeholder", "get_attr"):
        return None
    if node.op == "call_module":
        module = model.get_submodule(node.target)
        if isinstance(module, POINTWISE) or type(module) in SPATIAL:
            return None
        return f"layer {node.target} ({type(module).__name__}) has no tiled version"
    if node.kind in PIXELWISE:
        return None
    return f"{node.kind} in {_owner(graph, node)} may mix pixels of different tiles"


def _owner(graph: LayerGraph, node: Node) -> str:
    """The module whose forward calls a function node: `layer2.0.shortcut (PadShortcut)`, or `the model's forward`."""
    fx_node = next((n for n in graph.traced.graph.nodes if n.name == node.name), None) if graph.traced else None
    stack = (fx_node.meta.get("nn_module_stack") or {}) if fx_node is not None else {}
    if not stack:
        return "the model's forward"
    path, (_, cls) = list(stack.items())[-1]
    return f"{path} ({getattr(cls, '__name__', cls)})"


def _last_node(graph: LayerGraph, until: str) -> int | None:
    ids = [n.id for n in graph.nodes
           if n.op == "call_module" and (n.target == until or n.target.startswith(until + "."))]
    return max(ids) if ids else None


def _check_sizes(model: nn.Module, graph: LayerGraph, last: int, grid: TileGrid) -> list[tuple[str, tuple]]:
    """Every window layer of the front, on the tile it gets there: a whole number of strides, and halos that its
    neighbours hold; (layer, its input's shape for one sample) of each."""
    nodes, inputs = {n.id: n for n in graph.nodes}, []
    for n in graph.nodes[:last + 1]:
        if n.op != "call_module" or type(model.get_submodule(n.target)) not in (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d):
            continue
        shape = nodes[n.inputs[0]].shape if n.inputs else None
        if shape is None or len(shape) != 4:
            continue
        windows = windows_of(n.target, model.get_submodule(n.target))
        inputs.append((n.target, tuple(shape[1:])))
        for side, extent, window, what in zip(shape[H:], (grid.rows, grid.cols), windows, ("height", "width")):
            if extent > 1:
                if side % extent:
                    raise UserError(f"layer {n.target} gets a {what} of {side}, which does not divide into {extent} "
                                    "tiles: give an image side that divides by the tiles times the strides before it")
                check_side(n.target, window, side // extent, what)
    return inputs


def plan_front(model: nn.Module, until: str, grid: TileGrid, sample_shape: tuple[int, ...]) -> Front:
    """The layers that run on tiles when the front ends with module `until` ("auto": the deepest of the model's
    top-level modules that can end one); refused with one line naming what cannot. Kept per model (_keep)."""
    return _keep("front", model, sample_shape, (until, grid), lambda: _plan_front(model, until, grid, sample_shape))


def tiled_front(model: nn.Module, front: Front, grid: TileGrid,
                sample_shape: tuple[int, ...]) -> dict[str, nn.Module]:
    """The front's layers as the grid's first tile runs them (layers.tiled), by name; kept per model, front and grid
    (_keep): what a step's halos and statistics are priced on."""
    first = Tiles(grid, 0, tuple(range(grid.rows * grid.cols)))
    return _keep("tiled", model, sample_shape, (front.until, front.layers, grid),
                 lambda: {name: tiled(name, model.get_submodule(name), first) for name in front.layers})


def _plan_front(model: nn.Module, until: str, grid: TileGrid, sample_shape: tuple[int, ...]) -> Front:
    graph = _graph(model, sample_shape)
    cuts = set(cut_points(graph))
    if until == "auto":
        until = _deepest(model, graph, cuts, grid)
    last = _last_node(graph, until)
    if last is None:
        names = ", ".join(name for name, _ in model.named_children())
        raise UserError(f"--spatial-until {until}: the model has no layer of that name; its top-level modules are "
                        f"{names} (or a deeper path, e.g. layer2.1)")
    for n in graph.nodes[:last + 1]:
        why = _why_not(model, n, graph)
        if why is not None:
            raise UserError(f"the tiled front cannot reach the end of {until}: {why}; end it before "
                            f"(--spatial-until)")
    if last not in cuts:
        raise UserError(f"--spatial-until {until}: other tensors than its output flow past it (a skip connection "
                        "across it): end the front at the end of a block")
    inputs = _check_sizes(model, graph, last, grid)
    layers = []
    for n in graph.nodes[:last + 1]:
        if n.op == "call_module" and type(model.get_submodule(n.target)) in SPATIAL and n.target not in layers:
            layers.append(n.target)
    later = {n.target for n in graph.nodes[last + 1:] if n.op == "call_module"}
    shared = [name for name in layers if name in later]
    if shared:
        raise UserError(f"layer {shared[0]} runs both before and after the end of {until}: end the front before it")
    end = graph.nodes[last]
    return Front(tuple(layers), until, tuple(inputs), end.name, tuple(end.shape[1:]) if end.shape else (),
                 _on_image(graph, last), _stems(model, graph, last))


STEM = (nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d)


def _stems(model: nn.Module, graph: LayerGraph, last: int) -> tuple[tuple[str, str, str, str], ...]:
    """The front's chains that run as one fused stem (Front.stems)."""
    users: dict[int, int] = {}
    calls: dict[str, int] = {}
    for n in graph.nodes:
        for i in n.inputs:
            users[i] = users.get(i, 0) + 1
        if n.op == "call_module":
            calls[n.target] = calls.get(n.target, 0) + 1
    nodes = graph.nodes[:last + 1]
    out = []
    for i in range(len(nodes) - 3):
        chain = nodes[i:i + 4]
        if not all(n.op == "call_module" and type(model.get_submodule(n.target)) is kind and calls[n.target] == 1
                   for n, kind in zip(chain, STEM)):
            continue
        if all(b.inputs == [a.id] and users.get(a.id) == 1 for a, b in zip(chain, chain[1:])):
            out.append(tuple(n.target for n in chain))
    return tuple(out)


def _on_image(graph: LayerGraph, last: int) -> tuple[str, ...]:
    """The front's module nodes whose inputs depend on no parameter."""
    graded: set[int] = set()
    plain = []
    for n in graph.nodes[:last + 1]:
        if any(i in graded for i in n.inputs):
            graded.add(n.id)
            continue
        if n.op == "call_module":
            plain.append(n.target)
        if n.params:
            graded.add(n.id)
    return tuple(plain)


def _deepest(model: nn.Module, graph: LayerGraph, cuts: set[int], grid: TileGrid) -> str:
    """The last top-level module whose end is a cut point, whose front can run on tiles and whose layers' sizes
    divide into `grid` at this image size (a deeper end's stride may not: ResNet-50 at 224 px on 2 tiles reaches
    layer4's 7 px); refused with the shallowest end's reason when none does."""
    ends = _ends(model, graph, cuts)
    if not ends:
        raise UserError("no part of the model's front can run on tiles (its first layer has no tiled version): "
                        "use another strategy")
    sized = _sized(model, graph, ends, grid)
    if not sized:
        _check_sizes(model, graph, _last_node(graph, ends[0]), grid)  # raises the shallowest end's reason
    return sized[-1]


def _sized(model: nn.Module, graph: LayerGraph, ends: list[str], grid: TileGrid | None) -> list[str]:
    """Of `ends`, those whose front's layers divide into `grid` (all without one)."""
    if grid is None:
        return ends
    out = []
    for end in ends:
        try:
            _check_sizes(model, graph, _last_node(graph, end), grid)
        except UserError:
            continue
        out.append(end)
    return out


def _ends(model: nn.Module, graph: LayerGraph, cuts: set[int]) -> list[str]:
    """The top-level modules, in order, whose end is a cut point and whose front can run on tiles."""
    ends = []
    for name, _ in model.named_children():
        last = _last_node(graph, name)
        if last is None:
            continue
        if any(_why_not(model, n, graph) for n in graph.nodes[:last + 1]):
            break
        if last in cuts:
            ends.append(name)
    return ends


def front_ends(model: nn.Module, sample_shape: tuple[int, ...], grid: TileGrid | None = None) -> list[str]:
    """Where a front may end (`--spatial-until`), shallowest first: what `auto` chooses among; with `grid`, only
    the ends whose layers' sizes divide into its tiles at this image size."""
    def ends() -> list[str]:
        graph = _graph(model, sample_shape)
        return _sized(model, graph, _ends(model, graph, set(cut_points(graph))), grid)

    return list(_keep("ends", model, sample_shape, (grid,), ends))


def halo_bytes_per_sample(layer_of: Callable[[str], nn.Module], front: Front, tiles: Tiles, element_size: int,
                          recomputed: Callable[[str], int] = lambda name: 0) -> int:
    """What one sample's training step sends from this tile in halos and their gradients, from the geometry alone:
    per window layer and cut dimension, the tile before gets `after` rows in forward and `before` rows of
    gradient in backward, the tile after the other way round, across the tile's width (its row-padded height,
    for columns on a 2-D grid), all channels. A layer whose forward runs again in backward (`recomputed`: how many
    more times, forward_runs) sends its forward halos that many times more; one on the image (`Front.on_image`)
    sends no gradient back."""
    total = 0
    for name, (c, height, width) in front.inputs:
        layer = layer_of(name)  # its tiled version
        again = int(recomputed(name))
        graded = name not in front.on_image
        (br, ar), (bc, ac) = layer.widths
        h, w = height // tiles.grid.rows, width // tiles.grid.cols
        for dim, (before, after), across in ((0, (br, ar), w), (1, (bc, ac), h + br + ar)):
            prev, after_tile = tiles.grid.neighbours(tiles.index, dim)
            if prev is not None:
                total += (after * (1 + again) + before * graded) * c * across
            if after_tile is not None:
                total += (before * (1 + again) + after * graded) * c * across
    return total * element_size


class Cut(nn.Module):
    """This rank's tile of whole images (every rank of a replica reads the same batch)."""

    def __init__(self, tiles: Tiles) -> None:
        super().__init__()
        self.tiles = tiles

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, cols = self.tiles.grid.split(x.shape[H], x.shape[H + 1], self.tiles.index)
        return x[:, :, rows, cols]


class Gathered(nn.Module):
    """The tiles of the group assembled into the whole image (halo.gather), on every rank of the group."""

    def __init__(self, tiles: Tiles) -> None:
        super().__init__()
        self.tiles = tiles

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gather(x, self.tiles)


class TileInput(nn.Module):
    """The model fed this rank's tile of each image (the whole images come in)."""

    def __init__(self, model: nn.Module, tiles: Tiles) -> None:
        super().__init__()
        self.model, self.cut = model, Cut(tiles)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.cut(x))


def gather_after(blocked, until: str) -> int | None:
    """How many of the block graph's blocks (split/stages.Blocked) a front ending with module `until` covers;
    None when it ends inside a block (a pipeline's stages are runs of blocks: the tiles are gathered between two)."""
    last = _last_node(blocked.graph, until)
    for i, block in enumerate(blocked.blocks):
        if last in block.nodes:
            return i + 1 if block.nodes[-1] == last else None
    return None


def staged_until(model: nn.Module, until: str, blocked, sample_shape: tuple[int, ...],
                 grid: TileGrid | None = None) -> tuple[str, int]:
    """(the module ending the front, the blocks it covers) for tiles cut into pipeline stages: `auto`, the deepest
    top-level module the tiles reach that ends a block; a front ending inside a block is refused in one line."""
    ends = [e for e in front_ends(model, sample_shape, grid) if gather_after(blocked, e) is not None]
    if until == "auto":
        if not ends:
            raise UserError("no top-level module of the model both runs on tiles and ends a block, so the tiles "
                            "cannot be gathered between two pipeline stages' blocks: drop --stages")
        until = ends[-1]
    covered = gather_after(blocked, until)
    if covered is None:
        inside = next(b.name for b in blocked.blocks if _last_node(blocked.graph, until) in b.nodes)
        raise UserError(f"--spatial-until {until} ends inside block {inside}: with --stages the tiles are gathered "
                        f"between two blocks; end the front with one of {', '.join(ends) or 'none'}")
    return until, covered


def tile_front(model: nn.Module, front: Front, tiles: Tiles) -> list[nn.Parameter]:
    """Swap the front's layers for their tiled versions (in place, sharing their tensors) and gather the
    boundary module's output; the front's parameters, whose gradients are each tile's part of the whole's."""
    params: list[nn.Parameter] = []
    for name in front.layers:
        layer = tiled(name, model.get_submodule(name), tiles)
        _put(model, name, layer)
        params += [p for p in layer.parameters() if p.requires_grad and all(p is not q for q in params)]
    for conv, bn, relu, pool in front.stems:  # run as one (comm/spatial/stem.py); the ReLU is the stem's own
        model.get_submodule(conv).fuse(model.get_submodule(bn), model.get_submodule(pool))
        _put(model, relu, nn.Identity())
    model.get_submodule(front.until).register_forward_hook(lambda _m, _i, out: gather(out, tiles))
    return params


def checkpointed_units(units: list, front: Front, model: nn.Module) -> list:
    """Of activation checkpointing's units (train/recompute.Unit), those to checkpoint: a unit whose every layer is
    in a fused stem is left out (the stem keeps only its input and runs its forward again in its own backward;
    checkpointing it would run that forward a third time)."""
    fused = {name for chain in front.stems for name in chain}
    leaves = [name for name, m in model.named_modules() if name and next(m.children(), None) is None]
    return [u for u in units if not all(name in fused for name in leaves if u.covers(name))]


def forward_runs(front: Front, units: list) -> Callable[[str], int]:
    """How many more times a front layer's forward (and its halos) runs in backward: once under a checkpointed unit,
    once more for a fused stem's pooling (halo_bytes_per_sample's `recomputed`)."""
    pools = front.fused_pools()
    return lambda name: int(any(u.covers(name) for u in units)) + (name in pools)


def _put(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, attr, module)


def tile_blocks(cfg, mm, factory, sample_shape) -> tuple[list, int]:
    """The blocks' bytes (perf/peak.BlockBytes) as a tile's rank holds them: the front's a tile's share, with the
    tiled layers' own backward (the padded tiles their halo exchanges build again, perf/peak.py); and the tile a
    rank slices out of the whole batch it reads."""
    with torch.device("meta"):
        model = factory()
    until, grid = cfg.spatial.until, TileGrid(*square_grid(cfg.spatial.tiles))
    if cfg.layout.stages > 1:  # the tiles' pipelines gather between two blocks
        until, _ = staged_until(model, until, blocked_on_meta(model, sample_shape), sample_shape, grid)
    front = plan_front(model, until, grid, sample_shape)
    order = [name for name, _ in model.named_children()]
    top = front.until.split(".")[0]
    # a front ending inside a top-level module: that module counted whole (a bound, not the share)
    last = order.index(top) if "." not in front.until else order.index(top) - 1

    def in_front(name: str) -> bool:
        first = name.split(".")[0].split("+")[0]
        return first in order and order.index(first) <= last

    stems = [set(chain) for chain in front.stems] if cfg.layout.stages == 1 else []  # (tile_front fuses them)
    blocks = [b.tiled(1 / cfg.spatial.tiles, fused=set(b.layers) in stems) if in_front(b.name) else b
              for b in mm.blocks]
    return blocks, mm.input_bytes // cfg.spatial.tiles
