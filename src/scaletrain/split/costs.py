"""Each block's cost per micro-batch (split/partition.py's `BlockCost`): predicted from a calibration
(predict/node_times.py, the performance model of docs/predict.md) or measured here, block by block.

Bytes come from the block graph (perf/blocks.py), traced at some batch in fp32: they scale linearly with the
batch, and activations scale with the precision's bytes (bf16/fp16 autocast halves them; weights stay fp32).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import time
from typing import Any, Callable

import torch
from torch import nn

from scaletrain.errors import UserError
from scaletrain.perf.precision import ACTIVATION_BYTES
from scaletrain.split.partition import BlockCost
from scaletrain.split.stages import Blocked, stage_module

SOURCES = ("predicted", "measured")
ROUNDS = 3  # passes over the blocks when measuring; each block keeps its least time


def block_costs(blocked: Blocked, model: nn.Module, input_shape: tuple[int, ...], micro_batch: int, *,
                source: str = "predicted", calibration: dict[str, Any] | None = None, precision: str = "fp32",
                threads: int | None = None, ranks: int | None = None, rounds: int | None = None,
                device: torch.device | None = None, progress: Callable[[str, int, int], None] | None = None,
                tiles: tuple[int, int, int] | None = None, predictor: Any = None) -> list[BlockCost]:
    """The blocks' costs at `micro_batch` samples, predicted from `calibration` or a point's `predictor` (either
    basis: predict/predictor.py, predict/datasheet.py), or measured. `threads` and `ranks` (predicted only): the
    calibrated thread count to price at (default the calibrated machine's cores) and the processes sharing the node
    (default as many as the cores hold at `threads`: predict/node_times.py); measured times use this process's
    threads, the least of `rounds` passes over the blocks (default ROUNDS), on `device` (default the model's),
    `progress(block, timed, to_time)` told after each block is timed (console/phase.py shows it); `tiles` = (rows,
    columns, f) (measured only): the first f blocks timed on one tile of a rows x columns grid, as spatial tiles run
    them (halos aside), the rest on the whole image."""
    if source not in SOURCES:
        raise UserError(f"costs {source!r}: use one of {', '.join(SOURCES)}")
    if micro_batch < 1:
        raise UserError(f"a micro-batch of {micro_batch} samples: the batch must hold at least one per micro-batch")
    if source == "predicted":
        if calibration is None and predictor is None:
            raise UserError("predicted block costs need a calibration: run `scaletrain calibrate`, pass "
                            "--calibration FILE, or use --costs measured")
        times = _predicted(blocked, model, input_shape, micro_batch, calibration, precision, threads, ranks, predictor)
    else:
        times = _measured(blocked, model, input_shape, micro_batch, precision, rounds or ROUNDS, device, progress,
                          tiles)
    return [dataclasses.replace(c, forward_s=f, backward_s=bw)
            for c, (f, bw) in zip(block_sizes(blocked, micro_batch, precision), times)]


def block_sizes(blocked: Blocked, micro_batch: int, precision: str = "fp32") -> list[BlockCost]:
    """The blocks' bytes at `micro_batch` samples, their times not known (NaN): enough to check memory."""
    act = micro_batch / blocked.graph.batch_size * ACTIVATION_BYTES.get(precision, 4) / 4
    return [BlockCost(b.name, math.nan, math.nan, b.param_bytes, round(b.saved_bytes * act), round(b.out_bytes * act))
            for b in blocked.blocks]


def _predicted(blocked: Blocked, model: nn.Module, input_shape: tuple[int, ...], micro_batch: int,
               calibration: dict[str, Any] | None, precision: str, threads: int | None,
               ranks: int | None, predictor: Any = None) -> list[tuple[float, float]]:
    from scaletrain.predict.node_times import block_times, node_times

    if predictor is None and precision not in calibration.get("precisions", ["fp32"]):
        raise UserError(f"the calibration has no {precision} timings: calibrate with --precision {precision} "
                        "or use --costs measured")
    times = node_times(model, tuple(input_shape), micro_batch, calibration, precision, threads, ranks, predictor,
                       graph=blocked.graph)
    per_block = block_times(blocked.blocks, blocked.graph, times)
    unpriced = [b.name for b, (f, bw) in zip(blocked.blocks, per_block) if b.flops > 0 and f + bw <= 0]
    if unpriced:  # not a silent zero: a block that computes must cost something
        raise UserError(f"the calibration prices no op of block(s) {', '.join(unpriced[:3])}: use --costs measured")
    return per_block


def _measured(blocked: Blocked, model: nn.Module, input_shape: tuple[int, ...], micro_batch: int, precision: str,
              rounds: int, device: torch.device | None = None,
              progress: Callable[[str, int, int], None] | None = None,
              tiles: tuple[int, int, int] | None = None) -> list[tuple[float, float]]:
    """torchgpipe's balance_by_time measurement: each block run alone, forward and backward, on the tensor
    that reaches it, in training mode, as a stage runs it (`_as_trained`). Blocks are timed in turn, `rounds`
    times over, and each keeps its least time: on a shared machine another process's load only adds time,
    and passing over every block in turn spreads it instead of landing on one block. Timed on a copy of the
    traced model, so the model's BatchNorm statistics stay as they were. Each block goes to `device` only
    while it is timed (a pipeline's model stays in host memory: the whole of it may not fit the device)."""
    from scaletrain.perf.flops import probe_input

    assert blocked.graph.traced is not None
    root = blocked.root if blocked.root is not None else blocked.graph.traced
    copied = Blocked(blocked.graph, blocked.blocks, root=copy.deepcopy(root))
    modules = [stage_module(copied, i, i + 1) for i in range(len(copied.blocks))]
    home = next((p.device for p in model.parameters()), torch.device("cpu"))
    device = torch.device(device) if device is not None else home
    rows, cols, front = tiles or (1, 1, 0)
    c, h, w = input_shape if front else (None, None, None)
    inputs = [probe_input(model, (c, h // rows, w // cols) if front else input_shape, micro_batch).normal_().to(device)]
    best = [(math.inf, math.inf)] * len(modules)
    for r in range(max(1, rounds)):
        for i, (b, module) in enumerate(zip(copied.blocks, modules)):
            try:
                module.to(device)
                # the first block needs no input gradient, as in training (the data needs none)
                f, bw = _as_trained(module, inputs[i], precision=precision, input_grad=i > 0, device=device)
                if r == 0:
                    with torch.no_grad():
                        out = module(inputs[i])
                    # the tiles gathered after the front: the next block gets the whole image
                    inputs.append(out if i + 1 != front else out.new_empty(b.out_shape).normal_())
                module.to(home)
            except (ValueError, RuntimeError) as e:
                raise UserError(f"timing block {b.name} at a micro-batch of {micro_batch} failed "
                                f"({str(e).splitlines()[0]}): use a larger batch or fewer micro-batches") from None
            best[i] = (min(best[i][0], f), min(best[i][1], bw))
            if progress is not None:
                progress(b.name, r * len(modules) + i + 1, max(1, rounds) * len(modules))
    return best


def _as_trained(module: nn.Module, x: torch.Tensor, *, precision: str, input_grad: bool, device: torch.device,
                repeats: int = 5, min_s: float = 0.02) -> tuple[float, float]:
    """(forward, backward) seconds of one block run as a pipeline stage runs it: a forward in training mode
    on a fresh graph (in-place activations in place), then one backward of its output that frees the graph,
    the weights' gradients accumulated into `.grad` and the input's computed (unless `input_grad` is off:
    the first block, whose input is the data). The median of at least `repeats` such passes (more for a
    block too quick for `min_s`), after one untimed pass. `predict/timing.py`'s per-op `time_op` instead
    repeats the backward on one kept graph with activations out of place: on memory-bound blocks (ResNet-20's
    32x32 16-channel layer1) that came out 20-25% above the same block run this way (docs/split.md)."""
    from scaletrain.perf.precision import AUTOCAST
    from scaletrain.perf.timing import samples

    module.train()
    dtype = AUTOCAST[precision]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    grad: list[torch.Tensor] = []

    def once() -> tuple[float, float]:
        inp = x.detach().requires_grad_(input_grad and x.is_floating_point())
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            out = module(inp)
        sync()
        t1 = time.perf_counter()
        if out.requires_grad:
            if not grad:
                grad.append(torch.randn_like(out))
            out.backward(grad[0])
            sync()
        return t1 - t0, time.perf_counter() - t1

    f, b = once()
    runs = samples(once, least=max(repeats, min(100, math.ceil(min_s / max(f + b, 1e-6)))))
    module.zero_grad(set_to_none=True)
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def host_copy_rate(nbytes: int = 64 << 20) -> tuple[float, str]:
    """(bytes per second, what was measured): to and from pinned host memory on a GPU (the slower way); on a
    machine without one, a copy within host memory, the only copy there is."""
    from scaletrain.perf.timing import median_time

    if torch.cuda.is_available():
        host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        sync = torch.cuda.synchronize
        to_dev = median_time(lambda: dev.copy_(host, non_blocking=True), sync=sync)
        to_host = median_time(lambda: host.copy_(dev, non_blocking=True), sync=sync)
        return nbytes / max(to_dev, to_host), f"measured pinned host <-> {torch.cuda.get_device_name()} copies"
    a, b = torch.empty(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    seconds = median_time(lambda: b.copy_(a), repeats=3)
    return nbytes / seconds, "measured host memory copies (no GPU here: on one, the PCIe rate applies)"
