"""What autograd holds at a training step's peak, block by block (docs/perf.md, "Peak activation memory").

From the block graph (perf/blocks.py, on the meta device at the batch one rank computes): each block's saved
bytes (what its layers keep for backward), the bytes of the tensor entering it, and its largest output. In
backward, block k's gradients are computed while every block before it still holds what it saved, and the
gradient of k's output and of the tensor being computed are alive beside them:

    without checkpointing   peak = max_k ( saved_0 + ... + saved_k  +  T x largest_k )
    with checkpointing      peak = max_k ( input_0 + ... + input_k  +  saved_k  +  T x largest_k )

(with checkpointing each block keeps only its input until backward reaches it, then runs its forward again:
its own saved tensors are back, alone). T = 2 + WORKSPACE: the gradients of a layer's output and input, and the
convolution kernels' own workspace in backward. A block's `scale` (a spatial tile's share of a block that runs on tiles)
multiplies its bytes. Bytes are at the traced precision; perf/memory.activations_at converts them.
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
    transient: int = 2 + 2  # backward's transients in units of `largest` (TRANSIENT, below)

    def scaled(self, share: float) -> "BlockBytes":
        return replace(self, saved=int(self.saved * share), input=int(self.input * share),
                       largest=int(self.largest * share))


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
        largest = max((by_id[i].out_bytes for i in b.nodes if i in by_id), default=0)
        out.append(BlockBytes(b.name, b.saved_bytes, entering, largest, b.param_bytes, b.flops))
    return out


def peak(blocks: list[BlockBytes], checkpointed: bool = False, retained_below: int | None = None) -> int:
    """Bytes autograd holds at the step's peak (formulas above); 0 for no blocks.

    `retained_below`: an allocator that keeps what is freed below this size for the process (glibc's heap under
    its mmap threshold, as distributed/allocator.py sets it on a CPU) holds the high-water of those tensors to
    the end: the blocks whose tensors are that small count at their most, all together, beside the peak of the
    larger ones (a block's size taken as its largest tensor's)."""
    if retained_below is None:
        return _peak(blocks, checkpointed)
    small = [b for b in blocks if b.largest < retained_below]
    large = [b for b in blocks if b.largest >= retained_below]
    kept = sum(b.input for b in small) + _peak(small, True) if checkpointed else _peak(small, False)
    return kept + _peak(large, checkpointed)


def _peak(blocks: list[BlockBytes], checkpointed: bool) -> int:
    held, best = 0, 0
    for b in blocks:
        if checkpointed:
            best = max(best, held + b.input + b.saved + b.transient * b.largest)
            held += b.input
        else:
            held += b.saved
            best = max(best, held + b.transient * b.largest)
    return best
