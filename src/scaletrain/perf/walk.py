"""The one walk over a model: its layer graph, each node's output shape, parameters, FLOPs, output bytes and
(on the meta device) the bytes autograd saves for backward, the edges between nodes, and the cut points
where exactly one tensor crosses (docs/perf.md).

The base the performance model prices layer by layer, the split of a model into pipeline stages cuts (only
at a cut point can a pipeline cut: every other place has more than one tensor in flight), the graph command
draws and the pre-flight memory check counts. `walk` traces with torch.fx, one forward pass at batch
`batch_size` through fx's interpreter measuring shapes and FLOPs; a model fx cannot trace symbolically
(data-dependent control flow) is walked by its modules instead (`module_graph`: forward hooks, the one
fallback): an nn.Sequential as its children in the order they run (a chain: sound, each child reads the one
before), any other model as its leaf modules in call order, whose edges and cut points are unknown.
`layer_graph` is fx alone (raising `Untraceable` with fx's reason), for what needs fx's graph module.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.utils.flop_counter import FlopCounterMode

from scaletrain.errors import UserError
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
    in_shapes: list[tuple[int, ...]] | None = None  # the shapes of the tensors it read (module walk: as called)
    # a module-walk node that is a composite module (a Sequential's child block): the leaf modules it ran, in
    # call order (what the performance model prices); empty for a node that is itself one operation
    parts: list["Node"] = field(default_factory=list)


@dataclass
class LayerGraph:
    nodes: list[Node]
    batch_size: int
    traced: fx.GraphModule | None = field(default=None, repr=False)  # fx's module, sharing the model's weights
    traced_by: str = "fx"  # "fx", or "modules" (module_graph: the fallback for a model fx cannot trace)
    untraceable: str | None = None  # why fx could not trace it (traced_by "modules")
    # every byte autograd saved for backward in the pass (meta device), functional ops between modules
    # included; None when the pass ran on real tensors
    saved_bytes: int | None = None
    # the edges are the model's dataflow: fx's graph, or an nn.Sequential's children in order (False: a
    # module walk of another model, whose functional operations between modules were not seen)
    exact: bool = True

    def leaves(self) -> list[Node]:
        """The nodes that are one operation each, in order: a module walk's blocks opened into their parts."""
        return [p for n in self.nodes for p in (n.parts or [n])]

    @property
    def edges(self) -> list[tuple[int, int]]:
        return [(i, n.id) for n in self.nodes for i in n.inputs]

    def to_dict(self) -> dict[str, Any]:
        """graph.json's form: `nodes` (each with its `id`) and `edges` as [source_id, target_id] pairs."""
        return {"batch_size": self.batch_size, "nodes": [asdict(n) for n in self.nodes],
                "edges": [list(e) for e in self.edges]}


def walk(model: nn.Module, input_shape: tuple[int, ...], batch_size: int = 1) -> LayerGraph:
    """`model`'s graph at `batch_size` x `input_shape`: torch.fx's, else its modules' (module_graph). A forward
    that fails raises what it raised."""
    try:
        return layer_graph(model, input_shape, batch_size)
    except Untraceable as e:
        return module_graph(model, input_shape, batch_size, str(e))


def walk_or_explain(model: nn.Module, input_shape: tuple[int, ...], batch_size: int,
                    label: str = "the model") -> LayerGraph:
    """`walk`, with a forward that fails (or runs out of memory) told in one line naming `label`, the batch's
    shape and the fix (UserError): what the graph, the split and the prediction show a user."""
    shape = "x".join(str(d) for d in (batch_size, *input_shape))
    try:
        return walk(model, input_shape, batch_size)
    except UserError:
        raise
    except Exception as e:  # the user's forward itself fails on a batch of this shape
        first = str(e).splitlines()[0] if str(e) else ""
        if out_of_memory(e):
            raise UserError(f"tracing {label} on a batch of {shape} ran out of memory here ({first}): lower "
                            "--batch-size or --image-size") from None
        raise UserError(f"{label}'s forward fails on a batch of {shape} ({type(e).__name__}: {first}): "
                        "fix the model, or its --image-size / --in-channels") from None


def out_of_memory(e: BaseException) -> bool:
    """Whether an exception from running a model is the allocator's refusal (CPU or GPU)."""
    return isinstance(e, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(e)


def layer_graph(model: nn.Module, input_shape: tuple[int, ...], batch_size: int = 1) -> LayerGraph:
    """Trace `model` with torch.fx and run one forward pass of zeros of `batch_size` x `input_shape`.

    A walk's shapes, FLOPs and bytes are affine in the batch for a vision model (a batch norm's saved statistics are
    the constant): the model is walked at the batches ANCHORS and any larger batch is read off the line through
    them (ByBatch), once checked against a real walk at the first such batch; a model where the line does not hold
    is walked at every batch. A plan asks one model for a walk at a dozen batches."""
    if batch_size < ANCHORS[0] or not on_meta(model):  # (a walk of real tensors is walked at its batch alone)
        return _layer_graph(model, input_shape, batch_size)
    lines = _BY_BATCH.setdefault(model, {})
    key = (tuple(input_shape), _state(model))
    if key not in lines:
        try:
            lines[key] = ByBatch(*(_layer_graph(model, input_shape, b) for b in ANCHORS))
        except Exception:  # (a forward that fails at the anchors: walked, and told, at each batch asked)
            lines[key] = None
    line = lines[key]
    if line is None:
        return _layer_graph(model, input_shape, batch_size)
    graph = line.at(batch_size) if line.holds else None
    if graph is not None and (line.checked or batch_size in ANCHORS):
        return graph
    walked = _layer_graph(model, input_shape, batch_size)
    if graph is not None:  # the first batch off the anchors: the line is kept only where it gives the real walk
        line.checked, line.holds = True, same_walk(graph, walked)
    return walked


ANCHORS = (2, 3)  # (at a batch of 1 a walk puts the model in eval mode: another line)


class ByBatch:
    """Walks of one model at the batches ANCHORS, and the walk at another batch read off the line through them."""

    def __init__(self, a: LayerGraph, b: LayerGraph) -> None:
        self.a, self.b = a, b
        self.holds = _parallel(a.nodes, b.nodes)  # (the same nodes with the same constants at both batches)
        self.checked = False

    def at(self, batch: int) -> LayerGraph:
        (ba, bb), a = ANCHORS, self.a

        def num(x, y):
            return None if x is None else x + (y - x) * (batch - ba) // (bb - ba)

        def shape(x, y):
            return None if x is None else tuple(num(i, j) for i, j in zip(x, y))

        def node(x: Node, y: Node) -> Node:
            return dataclasses.replace(
                x, shape=shape(x.shape, y.shape), flops=num(x.flops, y.flops), out_bytes=num(x.out_bytes, y.out_bytes),
                saved_bytes=num(x.saved_bytes, y.saved_bytes), inputs=list(x.inputs),
                in_shapes=None if x.in_shapes is None else [shape(i, j) for i, j in zip(x.in_shapes, y.in_shapes)],
                parts=[node(i, j) for i, j in zip(x.parts, y.parts)])

        return dataclasses.replace(a, nodes=[node(x, y) for x, y in zip(a.nodes, self.b.nodes)], batch_size=batch,
                                   saved_bytes=num(a.saved_bytes, self.b.saved_bytes))


def _parallel(xs: list[Node], ys: list[Node]) -> bool:
    def alike(x: Node, y: Node) -> bool:
        same = ("name", "op", "kind", "target", "params", "param_bytes", "depthwise", "inputs")
        return (all(getattr(x, f) == getattr(y, f) for f in same)
                and (x.shape is None) == (y.shape is None) and len(x.shape or ()) == len(y.shape or ())
                and (x.saved_bytes is None) == (y.saved_bytes is None)
                and (x.in_shapes is None) == (y.in_shapes is None)
                and [len(i) for i in x.in_shapes or []] == [len(j) for j in y.in_shapes or []]
                and _parallel(x.parts, y.parts))

    return len(xs) == len(ys) and all(alike(x, y) for x, y in zip(xs, ys))


def same_walk(a: LayerGraph, b: LayerGraph) -> bool:
    """Whether two walks give the same nodes, numbers and shapes (their traced modules aside)."""
    return a.batch_size == b.batch_size and a.saved_bytes == b.saved_bytes and \
        [asdict(n) for n in a.nodes] == [asdict(n) for n in b.nodes]


def _state(model: nn.Module) -> tuple:
    """What a walk of the same model object reads besides the batch: its mode, grad mode, its modules (one replaced,
    e.g. by its tiled version, is another walk) and its parameters' device, dtype and requires_grad."""
    return (model.training, torch.is_grad_enabled(), tuple(id(m) for m in model.modules()),
            tuple((p.device.type, p.dtype, p.requires_grad) for p in model.parameters()))


def on_meta(model: nn.Module) -> bool:
    """Whether the model's parameters are on the meta device (a walk there costs no memory and no compute)."""
    param = next(model.parameters(), None)
    return param is not None and param.device.type == "meta"


_BY_BATCH: "weakref.WeakKeyDictionary[nn.Module, dict[tuple, ByBatch | None]]" = weakref.WeakKeyDictionary()


def _layer_graph(model: nn.Module, input_shape: tuple[int, ...], batch_size: int) -> LayerGraph:
    try:
        traced = fx.symbolic_trace(model)
    except Exception as e:  # fx raises TraceError, TypeError, ... from inside the user's forward
        raise Untraceable(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    ids = {node: i for i, node in enumerate(traced.graph.nodes)}
    nodes = [Node(ids[n], n.name, n.op, _kind(traced, n), str(n.target), None,
                  inputs=[ids[a] for a in n.all_input_nodes]) for n in traced.graph.nodes]
    measure = _Measure(traced, nodes, ids)
    measure.run_once(probe_input(model, input_shape, batch_size))
    _count_params(traced, nodes, ids)
    for fx_node in traced.graph.nodes:
        if fx_node.op == "call_module":
            m = traced.get_submodule(fx_node.target)
            nodes[ids[fx_node]].depthwise = (isinstance(m, nn.Conv2d) and m.groups > 1
                                             and m.groups == m.in_channels == m.out_channels)
    saved = measure.saved.total if measure.saved is not None else None
    return LayerGraph(nodes, batch_size, traced, saved_bytes=saved)


def module_graph(model: nn.Module, input_shape: tuple[int, ...], batch_size: int, why: str) -> LayerGraph:
    """The fallback walk: one forward pass through forward hooks. An nn.Sequential becomes a chain of its
    children (what Sequential.forward runs, repeats included), each composite child holding the leaf modules
    it ran as `parts`; any other model a chain of its leaf modules in call order, not `exact` (the functional
    operations between them are not seen). `why`: fx's reason, kept in `untraceable`."""
    sequential = isinstance(model, nn.Sequential)
    units = list(model._modules.items()) if sequential else \
        [(name, m) for name, m in model.named_modules() if not list(m.children())]
    leaves = [(name, m) for name, m in model.named_modules() if not list(m.children())]
    x = probe_input(model, input_shape, batch_size)
    nodes = [Node(0, "input", "placeholder", "placeholder", "x", tuple(x.shape),
                  out_bytes=x.numel() * x.element_size())]
    saved = SavedBytes(model) if x.device.type == "meta" else None
    stack: list[tuple[Node, float, int]] = []  # the unit being run: (its node, FLOPs and saved bytes before it)

    def node(name: str, m: nn.Module, args) -> Node:
        return Node(0, name, "call_module", type(m).__name__, name, None,
                    depthwise=isinstance(m, nn.Conv2d) and m.groups > 1 and m.groups == m.in_channels == m.out_channels,
                    in_shapes=[tuple(t.shape) for t in args if isinstance(t, torch.Tensor)])

    def done(n: Node, out: Any, flops_before: float, saved_before: int) -> None:
        n.flops = int(counter.get_total_flops() - flops_before)
        n.saved_bytes = saved.total - saved_before if saved is not None else None
        n.shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
        n.out_bytes = sum(t.numel() * t.element_size() for t in _tensors(out))

    def opens(name: str, frames: list[tuple[Node, float, int]]):
        def hook(m: nn.Module, args) -> None:
            frames.append((node(name, m, args), counter.get_total_flops(), saved.total if saved else 0))
        return hook

    def closes(frames: list[tuple[Node, float, int]], keep):
        def hook(m: nn.Module, args, out) -> None:
            n, f0, s0 = frames.pop()
            done(n, out, f0, s0)
            keep(n)
        return hook

    def add_unit(n: Node) -> None:
        n.id, n.inputs = len(nodes), [len(nodes) - 1]
        nodes.append(n)

    leaf_open: list[tuple[Node, float, int]] = []  # a composite unit's leaf being run
    unit_modules = {id(m) for _, m in units}
    handles = [h for name, m in {id(m): (name, m) for name, m in units}.values()
               for h in (m.register_forward_pre_hook(opens(name, stack)),
                         m.register_forward_hook(closes(stack, add_unit)))]
    if sequential:  # a composite child's leaves, each priced on its own
        handles += [h for name, m in leaves if id(m) not in unit_modules
                    for h in (m.register_forward_pre_hook(opens(name, leaf_open)),
                              m.register_forward_hook(closes(leaf_open, lambda n: stack[-1][0].parts.append(n))))]
    was_training = model.training
    if saved is None or batch_size == 1:
        model.eval()  # as fx's walk: train-mode BN rejects a batch of one with 1x1 maps
    try:
        with FlopCounterMode(display=False) as counter, saved or torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    if sequential and len(nodes) - 1 == len(units):  # a module in two places runs (and is named) once per place
        for n, (name, _m) in zip(nodes[1:], units):
            n.name = n.target = name
    nodes.append(Node(len(nodes), "output", "output", "output", "output", None, inputs=[len(nodes) - 1]))
    seen: set[int] = set()
    for n in nodes[1:-1]:
        for part in n.parts or [n]:
            for prm in model.get_submodule(part.target).parameters():
                if id(prm) not in seen:
                    seen.add(id(prm))
                    part.params += prm.numel()
                    part.param_bytes += prm.numel() * prm.element_size()
        if n.parts:
            n.params, n.param_bytes = sum(p.params for p in n.parts), sum(p.param_bytes for p in n.parts)
            for prm in model.get_submodule(n.target).parameters():  # a block's own, outside any leaf
                if id(prm) not in seen:
                    seen.add(id(prm))
                    n.params += prm.numel()
                    n.param_bytes += prm.numel() * prm.element_size()
    return LayerGraph(nodes, batch_size, None, "modules", why, saved.total if saved is not None else None,
                      exact=sequential)


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


NO_FLOPS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU,
            nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Hardswish, nn.Hardsigmoid, nn.modules.pooling._MaxPoolNd,
            nn.modules.pooling._AvgPoolNd, nn.modules.pooling._AdaptiveAvgPoolNd,
            nn.modules.pooling._AdaptiveMaxPoolNd, nn.modules.dropout._DropoutNd, nn.Identity, nn.Flatten)
"""Modules FlopCounterMode counts no FLOPs in (it counts matrix products and convolutions): run outside it, whose
decomposition of a batch norm on meta tensors took 5 ms a call (a third of a ResNet's memory walk)."""


def fits_meta_batch_norm(module: nn.Module | None, args: tuple) -> bool:
    """Whether `module(*args)` is a batch norm `meta_batch_norm` stands for: one meta tensor of its channels (any other
    call runs the module itself, which says what is wrong with it)."""
    return (isinstance(module, nn.modules.batchnorm._BatchNorm) and len(args) == 1
            and isinstance(args[0], torch.Tensor) and args[0].is_meta and args[0].dim() >= 2
            and args[0].shape[1] == module.num_features)


def meta_batch_norm(module: nn.modules.batchnorm._BatchNorm, x: torch.Tensor) -> torch.Tensor:
    """`module(x)` on meta tensors as autograd sees it, without running it: an output like `x` whose backward keeps
    what batch norm's keeps (its input, weight and running statistics, and the batch's mean and inverse deviation per
    channel in float32). On meta, torch runs batch norm as its Python decomposition, 1-5 ms a call: most of a
    ResNet's walk (test_perf_walk compares the two)."""
    stats = x.new_empty(x.shape[1], dtype=torch.float32)
    return _MetaBatchNorm.apply(x, module.weight, module.bias, module.running_mean, module.running_var, stats,
                                torch.empty_like(stats))


class _MetaBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, mean, invstd):  # noqa: D102
        ctx.save_for_backward(x, weight, running_mean, running_var, mean, invstd)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102 (a walk's pass never runs backward)
        raise NotImplementedError("a meta walk's batch norm has no backward")


class _Measure(fx.Interpreter):
    """Runs the traced graph node by node, recording each node's output shape, bytes and FLOPs."""

    def __init__(self, traced: fx.GraphModule, nodes: list[Node], ids: dict) -> None:
        super().__init__(traced)
        self.nodes, self.ids = nodes, ids

    def run_once(self, x: torch.Tensor) -> None:
        was_training = self.module.training
        # on meta tensors autograd's saved tensors cost nothing: count them (elsewhere they would be allocated)
        self.saved = SavedBytes(self.module) if x.device.type == "meta" else None
        if self.saved is None or x.shape[0] == 1:
            self.module.eval()  # as forward_flops: train-mode BN rejects a batch of one with 1x1 maps
        try:
            with self.saved or torch.no_grad():
                self.run(x)
        finally:
            self.module.train(was_training)

    def run_node(self, n: fx.Node) -> Any:
        before = self.saved.total if self.saved else 0
        node = self.nodes[self.ids[n]]
        module = self.module.get_submodule(n.target) if n.op == "call_module" else None
        args = self.fetch_args_kwargs_from_env(n)[0] if module is not None else ()
        if self.saved is not None and fits_meta_batch_norm(module, args):
            out = meta_batch_norm(module, args[0])
        elif isinstance(module, NO_FLOPS):
            out = super().run_node(n)  # counted, they are 0; the counter's decompositions on meta take seconds
        else:
            with FlopCounterMode(display=False) as counter:
                out = super().run_node(n)
            node.flops = int(counter.get_total_flops())
        if self.saved:
            node.saved_bytes = self.saved.total - before
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
