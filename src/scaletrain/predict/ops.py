"""A model as the operations the performance model prices: each node of its torch.fx graph (perf/walk.py)
becomes an `Op` of one kind with the features that kind's cost depends on (docs/predict.md).

Kinds and their features (batch first, square or not):
    conv     n, cin, cout, h, w (input), k, stride, grad_in        Conv2d (groups of a grouped conv: in n)
    dwconv   n, c, h, w, k, stride, grad_in                        depthwise Conv2d (groups = in = out channels)
    linear   n (all leading dims), fin, fout, grad_in              Linear
(grad_in: 1 when backward computes the gradient towards the op's input, 0 for a first layer.)
    norm     n, c, hw                                              BatchNorm1d/2d, GroupNorm, LayerNorm
    pool     n, c, h, w (input), k, stride                         MaxPool2d, AdaptiveMaxPool2d
    avgpool  n, c, h, w (input), k, stride                         AvgPool2d, AdaptiveAvgPool2d
    eltwise  elements (largest input or output), inputs            activations, add, mul, cat, pad, dropout ...
    view     -                                                     flatten, view, reshape, getitem on shapes ...
A module fx cannot trace symbolically is walked by its modules instead (perf/walk.module_graph, forward hooks):
its leaf modules become ops and the functional operations between them are not seen (the notes say so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from scaletrain.perf.walk import LayerGraph, walk_or_explain


_NORMS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "GroupNorm", "LayerNorm", "InstanceNorm2d", "SyncBatchNorm")
_POOLS = ("MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d")
_VIEWS = ("flatten", "view", "reshape", "size", "getattr", "Flatten", "Identity", "squeeze", "unsqueeze",
          "permute", "transpose", "contiguous", "dim", "chunk", "split", "Unflatten")


@dataclass
class Op:
    """One operation of the forward pass at the traced batch size."""

    name: str  # the fx node's (or module's) name
    kind: str  # one of KINDS, or "view" (no arithmetic: priced at the per-op overhead)
    features: dict[str, int]
    flops: int = 0
    out_bytes: int = 0
    param_numels: list[int] = field(default_factory=list)  # the parameters it owns, in registration order
    needs_input_grad: bool = True  # False for the first layer: nothing before it needs a gradient
    module: str = ""  # qualified module name (call_module nodes), for DDP's gradient order
    # whether autograd keeps its output (or input) for backward: what the memory model counts
    saves_activation: bool = True
    # backward's sum of the gradients a tensor read by several ops gets (autograd adds them as they arrive):
    # no forward, an element-wise add of the tensor's size per extra reader in backward
    backward_only: bool = False


@dataclass
class Workload:
    ops: list[Op]
    batch_size: int
    input_shape: tuple[int, ...]
    params: int
    param_bytes: int
    traced_by: str  # "fx" or "hooks"
    notes: list[str] = field(default_factory=list)
    # bytes autograd keeps for backward at this batch, traced in float32 (perf/saved.py); None when the trace
    # could not count them (not on the meta device, or module hooks): then the ops' outputs stand in
    saved_bytes: int | None = None
    buffer_bytes: int = 0  # the model's buffers (running statistics): what DDP broadcasts at every forward

    @property
    def activation_bytes(self) -> int:
        """What the memory model counts as activations (float32): the saved bytes, else every output."""
        if self.saved_bytes is not None:
            return self.saved_bytes
        return sum(op.out_bytes for op in self.ops if op.saves_activation)


def trace_ops(model: nn.Module, input_shape: tuple[int, ...], batch_size: int) -> Workload:
    """The ops of one forward pass of `batch_size` samples, from the one walk over the model (perf/walk.walk:
    torch.fx, else its modules through forward hooks)."""
    return workload_of(model, walk_or_explain(model, input_shape, batch_size), input_shape)


def workload_of(model: nn.Module, graph: LayerGraph, input_shape: tuple[int, ...]) -> Workload:
    """trace_ops from a walk already made of `model` (or of a copy of it) at the graph's batch."""
    batch_size = graph.batch_size
    ops = _fx_ops(model, graph) if graph.traced_by == "fx" else _module_ops(model, graph)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    pbytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    notes = [] if graph.traced_by == "fx" else [
        f"torch.fx cannot trace the model ({graph.untraceable}): its modules were walked through forward hooks, "
        "and functional operations between them are not priced"]
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return Workload(ops, batch_size, tuple(input_shape), params, pbytes,
                    "fx" if graph.traced_by == "fx" else "hooks", notes, saved_bytes=graph.saved_bytes,
                    buffer_bytes=buffers)


def _fx_ops(model: nn.Module, graph: LayerGraph) -> list[Op]:
    nodes = graph.nodes
    ops: list[Op] = []
    grad: dict[int, bool] = {}  # does the node's output carry a gradient (some parameter upstream)?
    for n in nodes:
        if n.op in ("placeholder", "output", "get_attr"):
            continue
        in_shapes = [nodes[i].shape for i in n.inputs if nodes[i].shape is not None]
        module = model.get_submodule(n.target) if n.op == "call_module" else None
        kind, features = classify(n.kind, module, in_shapes, n.shape)
        upstream = any(grad.get(i, False) for i in n.inputs)
        numels = [p.numel() for p in module.parameters(recurse=True) if p.requires_grad] if module is not None else []
        grad[n.id] = upstream or bool(numels)
        if "grad_in" in features:
            features["grad_in"] = int(upstream)
        ops.append(Op(n.name, kind, features, n.flops, n.out_bytes, numels, upstream,
                      n.target if module is not None else "", kind != "view"))
        readers = sum(m.inputs.count(n.id) for m in nodes if m.op != "output")
        if readers > 1 and grad[n.id] and n.shape is not None:  # its gradient arrives from several readers
            ops.append(Op(n.name, "eltwise", {"elements": math.prod(n.shape) * (readers - 1), "inputs": 2},
                          needs_input_grad=True, saves_activation=False, backward_only=True))
    return ops


def _module_ops(model: nn.Module, graph: LayerGraph) -> list[Op]:
    """A module walk's leaf modules as ops, in call order; all but the first need their input's gradient."""
    ops = []
    for j, n in enumerate(x for x in graph.leaves() if x.op == "call_module"):
        m = model.get_submodule(n.target)
        kind, features = classify(n.kind, m, n.in_shapes or [], n.shape)
        if "grad_in" in features:
            features["grad_in"] = int(j > 0)
        ops.append(Op(n.name, kind, features, n.flops, n.out_bytes,
                      [p.numel() for p in m.parameters() if p.requires_grad], j > 0, n.target, kind != "view"))
    return ops


def classify(kind: str, module: nn.Module | None, in_shapes: list, out_shape) -> tuple[str, dict[str, int]]:
    """(op kind, features) of one node: its class or function name, its module, input and output shapes."""
    x = in_shapes[0] if in_shapes else None
    if isinstance(module, nn.Conv2d) and x is not None and len(x) == 4:
        g, k, stride = module.groups, int(module.kernel_size[0]), int(module.stride[0])
        h, w = _same_padded(x, out_shape, stride)
        pad = {} if (h, w) == (x[2], x[3]) else {"pad": _padding(module)}  # (timed as it is: ops.build_op)
        if g > 1 and g == x[1] == module.out_channels:
            return "dwconv", {"n": x[0], "c": x[1], "h": h, "w": w, "k": k, "stride": stride, "grad_in": 1, **pad}
        return "conv", {"n": x[0] * g, "cin": x[1] // g, "cout": module.out_channels // g, "h": h, "w": w,
                        "k": k, "stride": stride, "grad_in": 1, **pad}
    if isinstance(module, nn.Linear) and x is not None:
        return "linear", {"n": math.prod(x[:-1]), "fin": x[-1], "fout": module.out_features, "grad_in": 1}
    if kind in _NORMS and x is not None and len(x) >= 2:
        return "norm", {"n": x[0], "c": x[1], "hw": math.prod(x[2:]) if len(x) > 2 else 1}
    if kind in _POOLS and x is not None and len(x) == 4 and out_shape is not None and len(out_shape) == 4:
        k, stride = _pool_window(module, x, out_shape)
        return "avgpool" if "Avg" in kind else "pool", {"n": x[0], "c": x[1], "h": x[2], "w": x[3], "k": k,
                                                        "stride": stride}
    if kind in _VIEWS or out_shape is None:
        return "view", {}
    sizes = [math.prod(s) for s in in_shapes] + [math.prod(out_shape)]
    inplace = {"inplace": 1} if getattr(module, "inplace", False) is True else {}  # ReLU(inplace=True): no output made
    return "eltwise", {"elements": max(sizes), "inputs": max(1, len(in_shapes)), **inplace}


def _same_padded(x, out_shape, stride: int) -> tuple[int, int]:
    """The input side a convolution padded "same" (as the grid times them: padding k // 2) needs to give this one's
    output: its own, unless it pads less (LeNet's 5x5 convolutions without padding: 32 -> 28 px), when the
    output times the stride. Its work and the op timed for it are then the convolution's own (timed at its input
    side, LeNet-5's second convolution cost twice its work)."""
    if out_shape is None or len(out_shape) != 4:
        return int(x[2]), int(x[3])
    sides = []
    for i in (2, 3):
        same = -(-x[i] // stride)
        sides.append(int(x[i]) if out_shape[i] == same else int(out_shape[i]) * stride)
    return sides[0], sides[1]


def _padding(module: nn.Conv2d) -> int:
    p = module.padding
    return 0 if isinstance(p, str) else int(p[0])


def _pool_window(module: nn.Module | None, x, out_shape) -> tuple[int, int]:
    k = getattr(module, "kernel_size", None)
    s = getattr(module, "stride", None)
    if k is not None:
        k = k if isinstance(k, int) else k[0]
        s = k if s is None else (s if isinstance(s, int) else s[0])
        return int(k), int(s)
    stride = max(1, x[2] // max(1, out_shape[2]))  # adaptive: the window it amounts to
    return int(x[2] - (out_shape[2] - 1) * stride), int(stride)


# ------------------------------------------------------------------ building one op to time it
POOL_INPUT = "rectified"
"""What max pooling is timed on (a calibration says which in its `pool_input`; older ones: "normal"). Its time
follows its branches: on normal random numbers it ran 1.29-1.48x its time on the post-ReLU activations of the
reference networks 64 steps into training (refnet, the memory net; LeNet-5 after 96 steps 1.59-2.52x: docs/predict.md,
"Op times"). "rectified": such a feature map (`rectified_field`); "normal": torch.randn."""


def rectified_field(shape: tuple[int, ...]) -> torch.Tensor:
    """max(0, z - 0.2) for z a normal field smoothed over 3x3 neighbours and scaled to unit spread: 58% zeros,
    neighbours alike, as a trained network's feature maps after a ReLU. Max pooling on it ran 0.99-1.14x its time
    on the reference networks' trained activations (two seeds each; LeNet-5's, held out: 1.20-1.81x)."""
    z = torch.randn(shape)
    if z.dim() == 4 and min(z.shape[-2:]) >= 3:
        z = torch.nn.functional.avg_pool2d(torch.nn.functional.pad(z, (1, 1, 1, 1), mode="replicate"), 3, 1)
        z.div_(z.std().clamp_min(1e-12))
    return z.sub_(0.2).relu_()


def build_op(kind: str, f: dict[str, int], pool_input: str = POOL_INPUT) -> tuple[nn.Module, list[torch.Tensor]]:
    """A module and its input(s) computing one op of `kind` with features `f` (for calibration); max pooling's
    input as `pool_input` says (POOL_INPUT)."""
    if kind in ("conv", "dwconv"):
        cin, cout, groups = (f["cin"], f["cout"], 1) if kind == "conv" else (f["c"], f["c"], f["c"])
        pad, (h, w) = f.get("pad", f["k"] // 2), _input_side(f)
        m = nn.Conv2d(cin, cout, f["k"], stride=f["stride"], padding=pad, groups=groups, bias=False)
        return m, [torch.randn(f["n"], cin, h, w)]
    if kind == "linear":
        return nn.Linear(f["fin"], f["fout"]), [torch.randn(f["n"], f["fin"])]
    if kind == "norm":
        side = max(1, int(round(math.sqrt(f["hw"]))))
        if side * side == f["hw"] and f["hw"] > 1:
            return nn.BatchNorm2d(f["c"]), [torch.randn(f["n"], f["c"], side, side)]
        return nn.BatchNorm1d(f["c"]), [torch.randn(f["n"], f["c"], f["hw"]) if f["hw"] > 1 else torch.randn(f["n"], f["c"])]
    if kind == "pool":
        shape = (f["n"], f["c"], f["h"], f["w"])
        return nn.MaxPool2d(f["k"], f["stride"]), [rectified_field(shape) if pool_input == "rectified" else
                                                   torch.randn(shape)]
    if kind == "avgpool":  # an odd window keeps the map's size at stride 1, as models pad it
        return (nn.AvgPool2d(f["k"], f["stride"], padding=f["k"] // 2 if f["k"] % 2 else 0),
                [torch.randn(f["n"], f["c"], f["h"], f["w"])])
    if kind == "eltwise":
        if f["inputs"] >= 2:
            return _Add(), [torch.randn(f["elements"]), torch.randn(f["elements"])]
        return nn.ReLU(), [torch.randn(f["elements"])]
    raise ValueError(f"no builder for op kind {kind!r}")


def _input_side(f: dict[str, int]) -> tuple[int, int]:
    """A convolution's input side: its features' own (padded "same"), or, with a `pad` of its own, what gives the
    output that side describes ((out - 1) x stride + k - 2 pad)."""
    if "pad" not in f:
        return f["h"], f["w"]
    return tuple((-(-side // f["stride"]) - 1) * f["stride"] + f["k"] - 2 * f["pad"] for side in (f["h"], f["w"]))


class _Add(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b
