"""Timing one operation's forward and backward on this machine, as the training loop runs it (calibration).

Forward: the module called in training mode with autograd recording (what `forward` pays per layer).
Backward: one pass of autograd over that op alone (`torch.autograd.grad` towards its input and its
parameters, the graph kept so it repeats); its input needs a gradient unless the op is the first layer.
Each figure is the median of `repeats` timed batches, each batch long enough (`min_batch_s`) for the
clock's resolution to vanish. An activation the model runs in place has its forward timed in place (`inplace`),
its backward out of place (an in-place op cannot run twice on one autograd graph; the same kernel). Under bf16
or fp16 an op's input is in that precision, as the op before it hands it over under autocast (every op but a first
layer, which gets the fp32 image): a batch norm of ResNet-20 ran 4.6x faster on the bf16 output of its convolution
than on fp32 (`INPUTS`). An op is timed with its pages settled (`PAGES`): a training rank's heap comes to hold
every tensor of its step (distributed/allocator.py), so after its first steps its ops take no fresh pages from the
kernel, while the first passes of a shape new to a timing process page its tensors in (a batch norm's backward at
256x16x32x32: 12.0 ms timed first, 5.4 settled), and a tensor above glibc's mmap threshold is paged in at every
pass unless the heap serves it (ResNet-50's 7x7 stem convolution at batch 32: 185 ms forward, 78 from the heap).
So the op is timed from the heap (allocator.from_heap), after untimed passes until one takes no fresh pages.
`time_grid_op` builds and times one op of the grid, the one way calibrate and predict --time-ops both time one.
"""

from __future__ import annotations

import contextlib
import copy
import statistics

import torch
from torch import nn

from scaletrain.distributed.allocator import from_heap
from scaletrain.perf.precision import AUTOCAST
from scaletrain.perf.timing import FRESH_PAGES, median_time, minor_faults


INPUTS = "autocast"
"""What an op's inputs are under bf16/fp16 (a calibration says which in its `op_inputs`; older ones: "fp32"):
"autocast", the low precision, as the op before it hands them over (a first layer's stay fp32); "fp32": fp32, for
autocast to cast (or not: a batch norm then ran on fp32, 4.6x its time on bf16 in ResNet-20 here)."""

PAGES = "settled"
"""How an op's pages stand when it is timed (a calibration says which in its `pages`; older ones: "first"):
"settled", from the heap, after passes until one takes no fresh pages (as a training rank's steady heap), and only
timed batches that took no more than the fewest any batch took count (perf/timing.median_time); "first", timed at
once, its first passes paging in what the timing process's heap lacked, and a tensor above the mmap threshold at
every pass."""
SETTLE_PASSES = 12  # at most this many untimed passes before an op is timed (settle_pages)


def time_op(module: nn.Module, inputs: list[torch.Tensor], *, precision: str = "fp32", input_grad: bool = True,
            device: torch.device | None = None, repeats: int = 5, min_batch_s: float = 0.01,
            inplace: bool = False, op_inputs: str = INPUTS, pages: str = PAGES) -> tuple[float, float]:
    """(forward seconds, backward seconds) of `module(*inputs)` in training mode. `inplace`: the model runs it in
    place (ReLU(inplace=True)), so its forward is timed so, repeated on one tensor: out of place a large output's
    fresh pages cost more than its arithmetic (a ReLU on ResNet-50's 103 MB stem activation: 54 ms out of place, 5 ms
    in place, here). Its backward is the out-of-place op's: the same kernel. `op_inputs`: INPUTS; `pages`: PAGES."""
    device = device or torch.device("cpu")
    low = AUTOCAST[precision]
    if low is not None and input_grad and op_inputs == "autocast":  # not a first layer: its producer's precision
        inputs = [t.to(low) if t.is_floating_point() else t for t in inputs]
    in_place_s = _in_place_forward(module, inputs, device, repeats, min_batch_s) if inplace else None
    for m in module.modules():
        if hasattr(m, "inplace"):
            m.inplace = False
    module = module.to(device).train()
    leaves = [t.to(device).requires_grad_(input_grad and t.is_floating_point()) for t in inputs]
    xs = [t * 1.0 if t.requires_grad else t for t in leaves]  # not leaves: gradients stop at them
    params = [p for p in module.parameters() if p.requires_grad]
    dtype = AUTOCAST[precision]
    sync = torch.cuda.synchronize if device.type == "cuda" else None

    def forward() -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            return module(*xs)

    settled = pages == "settled"

    def timed_forward() -> float:
        return median_time(forward, repeats, min_batch_s, sync, settled) if in_place_s is None else in_place_s

    with from_heap() if settled and device.type == "cpu" else contextlib.nullcontext(False) as heap:
        forward_s = None if settled else timed_forward()  # "first": timed before anything else, as it was
        out = forward()
        wrt = [x for x in xs if x.requires_grad] + params
        backward = out.requires_grad and bool(wrt)
        grad = torch.randn_like(out) if backward else None
        if settled:
            settle_pages(lambda: torch.autograd.grad(forward(), wrt, grad) if backward else forward(), heap=heap)
            forward_s = timed_forward()
        if not backward:
            return forward_s, 0.0
        backward_s = median_time(lambda: torch.autograd.grad(out, wrt, grad, retain_graph=True), repeats,
                                 min_batch_s, sync, settled)
    return forward_s, backward_s


def settle_pages(step, passes: int = SETTLE_PASSES, heap: bool = True) -> int:
    """Run `step` (one untimed pass of an op) until a pass takes no more fresh pages from the kernel than
    FRESH_PAGES, at most `passes` times; the passes run (PAGES). From the heap (`heap`) the count falls to none
    once the heap has grown past the op's fragments (a 64 MiB tensor alone: after 1-9 allocations here); without it,
    what the count stops falling at is paged in every time (a tensor above glibc's mmap threshold), and two passes
    alike are enough."""
    previous = None
    for done in range(1, passes + 1):
        before = minor_faults()
        step()
        taken = minor_faults() - before
        if taken <= FRESH_PAGES or (not heap and previous is not None and taken >= previous - FRESH_PAGES):
            return done
        previous = taken
    return passes


def conventions(cal: dict | None = None) -> dict[str, str]:
    """How a grid op is timed: this code's way (cal None: what `calibrate` writes into a calibration), or the way
    calibration `cal` was timed (older ones lack the fields that came later: max pooling on normal numbers, low
    precision on fp32 inputs, ops timed at their first passes), so that a shape timed for it is priced as its grid
    was."""
    from scaletrain.predict.ops import POOL_INPUT

    if cal is None:
        return {"pool_input": POOL_INPUT, "op_inputs": INPUTS, "pages": PAGES}
    return {"pool_input": cal.get("pool_input", "normal"), "op_inputs": cal.get("op_inputs", "fp32"),
            "pages": cal.get("pages", "first")}


def time_grid_op(kind: str, f: dict[str, int], *, precision: str, device: torch.device, repeats: int,
                 cal: dict | None = None) -> tuple[float, float]:
    """(forward seconds, backward seconds) of one op of the grid (kind, features), built and timed as `calibrate`
    times its grid, in the conventions of calibration `cal` (None: this code's)."""
    from scaletrain.predict import ops

    how = conventions(cal)
    module, inputs = ops.build_op(kind, f, how["pool_input"])
    return time_op(module, inputs, precision=precision, input_grad=bool(f.get("grad_in", 1)), device=device,
                   repeats=repeats, inplace=bool(f.get("inplace")), op_inputs=how["op_inputs"], pages=how["pages"])


def _in_place_forward(module: nn.Module, inputs: list[torch.Tensor], device: torch.device, repeats: int,
                      min_batch_s: float) -> float | None:
    """Seconds of the module's forward in place on one tensor; None for a module with no in-place form."""
    if not any(hasattr(m, "inplace") for m in module.modules()):
        return None
    ip = copy.deepcopy(module).to(device)
    for m in ip.modules():
        if hasattr(m, "inplace"):
            m.inplace = True
    xs = [t.detach().to(device).clone() for t in inputs]

    def forward() -> None:
        with torch.no_grad():
            ip(*xs)

    return median_time(forward, repeats, min_batch_s, torch.cuda.synchronize if device.type == "cuda" else None)


HARNESS_CHAIN = 32  # tiny ops in the chain that stands for a real step's


def harness_excess(device: torch.device | None = None, rounds: int = 9) -> dict[str, float]:
    """What timing an op alone adds to its seconds, per direction: a tiny op (ReLU on 16x64) timed as
    `time_op` times it, against the same op's share of a chain of HARNESS_CHAIN of them run as a step runs
    them (one forward, one `backward()` for the whole chain). Alone, each call pays what a step pays once:
    the autocast context per forward, an autograd engine start per backward. The two are timed alternately,
    `rounds` times, and each figure is the median over the rounds of its difference (a few microseconds
    between figures that drift by as much). {forward_s, backward_s: the excess (0 or more);
    chain_forward_s, chain_backward_s: the tiny op's cost in the chain}."""
    device = device or torch.device("cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    x = torch.randn(16, 64, device=device)
    chain = nn.Sequential(*[nn.ReLU() for _ in range(HARNESS_CHAIN)]).to(device)
    leaf = x.clone().requires_grad_(True)
    grad = torch.ones_like(x)
    ops = HARNESS_CHAIN + 1  # the chain and the product that makes its input a non-leaf

    def forward() -> torch.Tensor:
        return chain(leaf * 1.0)

    rows = []
    for _ in range(rounds):
        alone_f, alone_b = time_op(nn.ReLU(), [x], device=device, repeats=3)
        forward_s = median_time(forward, 3, 0.01, sync)
        step_s = median_time(lambda: forward().backward(grad), 3, 0.01, sync)
        chain_f, chain_b = forward_s / ops, max(step_s - forward_s, 0.0) / ops
        rows.append((alone_f - chain_f, alone_b - chain_b, chain_f, chain_b))
    excess_f, excess_b, chain_f, chain_b = (statistics.median(column) for column in zip(*rows))
    return {"forward_s": max(excess_f, 0.0), "backward_s": max(excess_b, 0.0),
            "chain_forward_s": chain_f, "chain_backward_s": chain_b}
