"""What autograd holds at a training step's peak, block by block (docs/perf.md, "Peak activation memory").

From the block graph (perf/blocks.py, on the meta device at the batch one rank computes): each block's saved
bytes (what its layers keep for backward), the bytes of the tensor entering it, and its largest output. In
backward, block k's gradients are computed while every block before it still holds what it saved, and the
gradient of k's output and of the tensor being computed are alive beside them:

    without checkpointing   peak = max_k ( saved_0 + ... + saved_k-1  +  inner_k )
    with checkpointing      peak = max_k ( input_0 + ... + input_k  +  inner_k )
    inner_k                      = max over block k's layers j ( saved by its layers up to j  +  transient_j )

(with checkpointing each block keeps only its input until backward reaches it, then runs its forward again:
its own saved tensors are back, alone; inside a block, backward frees a layer's saved tensors once past it).
transient_j is what layer j's backward makes beside them, by its kind (in: its input's bytes, out: its output's):

    convolution      the gradients of its output and input, and the kernels' workspace   (1 + WORKSPACE) out + in
    max/avg pooling  the gradients of its output and input                                out + in
    BatchNorm, ReLU and other pointwise layers, additions                                 2 x out
    any other kind   T x out, T = 2 + WORKSPACE

A block that runs on spatial tiles is `tiled` to a tile's share: its inner peak is then that of the tiled
layers' own backward (comm/spatial/layers.py), layer kind by kind (`tiled_inner`):

    convolution      the output's gradient, the workspace, the padded tile made again and the input's gradient
                     (1 + WORKSPACE) x out + 2 x in
    BatchNorm        the output's gradient (the input's is made in the memory it saved)       1 x out
    max pooling      the padded tile, the maxima's positions (int64), then the gradients     in + out + 2 x out
    anything else    as above

and a block that is a fused stem (convolution, BatchNorm, ReLU, max pooling: comm/spatial/stem.py) keeps only its
input and peaks at `stem_inner` in its backward.
Bytes are at the traced precision; perf/memory.activations_at converts them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from scaletrain.perf.blocks import Block
from scaletrain.perf.walk import LayerGraph


@dataclass(frozen=True)
class BlockBytes:
    name: str
    saved: int  # bytes its layers save for backward
    input: int  # bytes of the tensors entering it (what checkpointing keeps)
    largest: int  # its largest output: with the gradients in flight, what backward holds besides the saved
    params: int = 0  # parameter bytes (fp32)
    flops: int = 0  # forward FLOPs at the traced batch
    # backward's peak inside the block: over its layers j, the saved tensors of layers up to j (the later ones'
    # are freed by then) and T x layer j's output; None: taken as saved + T x largest
    inner: int | None = None
    # the same on spatial tiles (whole images' bytes: `tiled` takes a tile's share); None: not known
    tiled_inner: int | None = None
    layers: tuple[str, ...] = ()  # its layers' module paths
    # a block that is a convolution, BatchNorm, ReLU and max pooling run fused on tiles (comm/spatial/stem.py):
    # its backward's peak, beside the input it keeps (None: not such a block)
    stem_inner: int | None = None

    @property
    def backward_peak(self) -> int:
        return self.saved + TRANSIENT * self.largest if self.inner is None else self.inner

    def tiled(self, share: float, fused: bool = False) -> "BlockBytes":
        """The block as a tile's rank holds it: a `share` of every tensor, its backward the tiled layers' (`fused`:
        the fused stem's, which keeps only its input)."""
        inner = self.tiled_inner if self.tiled_inner is not None else self.inner
        saved = self.saved
        if fused and self.stem_inner is not None:
            inner, saved = self.stem_inner, self.input
        return replace(self, saved=int(saved * share), input=int(self.input * share),
                       largest=int(self.largest * share), inner=None if inner is None else int(inner * share),
                       tiled_inner=None, stem_inner=None)


WORKSPACE = 2
"""A convolution's backward workspace, in units of its output: measured on this CPU (torch 2.13's oneDNN kernels,
one thread) as the resident memory a lone convolution's backward adds beyond its input gradient: 1.5x its output
for ResNet-18's 7x7 stem at 1024 px, 2.6x for a 64-channel 3x3 at 512 px (docs/perf.md)."""
TRANSIENT = 2 + WORKSPACE


def block_bytes(graph: LayerGraph, blocks: list[Block], input_bytes: int) -> list[BlockBytes]:
    """Each block's bytes from the layer graph it groups (`input_bytes`: the batch entering the model)."""
    by_id = {n.id: n for n in graph.leaves()}
    out = []
    for b in blocks:
        entering = sum(blocks[i].out_bytes for i in b.inputs) if b.inputs else input_bytes
        layers = [by_id[i] for i in b.nodes if i in by_id]
        largest = max((n.out_bytes for n in layers), default=0)
        held, inner, tiled = 0, 0, 0
        for n in layers:
            held += n.saved_bytes if n.saved_bytes is not None else 0
            came = sum(by_id[i].out_bytes for i in n.inputs if i in by_id) or entering
            inner = max(inner, held + _transient(n.kind, came, n.out_bytes))
            tiled = max(tiled, held + _tiled_transient(n.kind, came, n.out_bytes))
        exact = all(n.saved_bytes is not None for n in layers)
        out.append(BlockBytes(b.name, b.saved_bytes, entering, largest, b.param_bytes, b.flops,
                              inner if exact else None, tiled if exact else None,
                              tuple(n.target for n in layers if n.op == "call_module"), _stem_inner(layers, entering)))
    return out


def _stem_inner(layers: list, entering: int) -> int | None:
    """A fused stem's backward (comm/spatial/stem.py), with the input it keeps: the convolution's output U
    normalised and the pooling's padded input, then the maxima's int64 positions (2 x the pooling's output P),
    then the gradient made in the pooling's place, then the convolution's backward (its workspace and padded input)
    beside the output gradient: input + max(2 U + 2 P, (1 + WORKSPACE) U + input)."""
    if [n.kind for n in layers] != ["Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d"]:
        return None
    u, p = layers[0].out_bytes, layers[3].out_bytes
    return entering + max(2 * u + 2 * p, (1 + WORKSPACE) * u + entering)


POINTWISE = frozenset({"ReLU", "ReLU6", "LeakyReLU", "GELU", "SiLU", "Sigmoid", "Tanh", "Hardswish", "Dropout",
                       "relu", "gelu", "silu", "sigmoid", "tanh", "dropout"})
"""Layers and functions whose backward makes one gradient of their output's size."""


def _transient(kind: str, came: int, out: int) -> int:
    """What a layer of this kind holds in its backward beside the saved tensors (torch's own kernels): the
    gradient of its output and that of its input, and a convolution's workspace; T x out for a kind not listed."""
    if kind == "Conv2d":
        return (1 + WORKSPACE) * out + came
    if kind in ("BatchNorm2d", "add", "iadd") or kind in POINTWISE:
        return 2 * out
    if kind in ("MaxPool2d", "AvgPool2d"):
        return came + out
    return TRANSIENT * out


def _tiled_transient(kind: str, came: int, out: int) -> int:
    """What the tiled version of a layer of this kind holds in its backward beside the saved tensors (above)."""
    if kind == "Conv2d":
        return (1 + WORKSPACE) * out + 2 * came
    if kind == "BatchNorm2d":
        return out
    if kind == "MaxPool2d":
        return came + 3 * out
    return _transient(kind, came, out)


def peak(blocks: list[BlockBytes], checkpointed: bool | frozenset[str] = False,
         retained_below: int | None = None) -> int:
    """Bytes autograd holds at the step's peak (formulas above); 0 for no blocks. `checkpointed`: every block,
    none, or the blocks of those names.

    `retained_below`: an allocator that keeps what is freed below this size for the process (glibc's heap under
    its mmap threshold, as distributed/allocator.py sets it on a CPU) holds the high-water of those tensors to
    the end: the blocks whose tensors are that small count at their most, all together, beside the peak of the
    larger ones (a block's size taken as its largest tensor's)."""
    again = [checkpointed if isinstance(checkpointed, bool) else b.name in checkpointed for b in blocks]
    if retained_below is None:
        return _peak(blocks, again)
    small = [(b, a) for b, a in zip(blocks, again) if b.largest < retained_below]
    large = [(b, a) for b, a in zip(blocks, again) if b.largest >= retained_below]
    return sum(_peak([b for b, _ in part], [a for _, a in part]) for part in (small, large))


def _peak(blocks: list[BlockBytes], again: list[bool]) -> int:
    held, best = 0, 0
    for b, recomputed in zip(blocks, again):
        if recomputed:  # it keeps its input; in backward its own saved tensors are back, alone
            best = max(best, held + b.input + b.backward_peak)
            held += b.input
        else:
            best = max(best, held + b.backward_peak)
            held += b.saved
    return best
