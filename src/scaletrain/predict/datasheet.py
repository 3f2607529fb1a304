"""The data-sheet basis (`predict --hardware`): a machine the user does not have, priced from its profile
alone (perf/hardware.py). Nothing of this machine enters: no calibration is read or made, no loop factor,
no speed probe (docs/predict.md, "Two bases").

Each op is a roofline (perf/hardware.roofline_time) on the bytes it moves and the FLOPs it does, at the
efficiency of its class: `compute` for convolutions and matmuls (their FLOPs against the peak the op runs
at), `memory` for the rest (their bytes against the memory bandwidth). Both efficiencies are fitted to
published training throughputs (benchmarks/published/, `benchmarks/fit_datasheet.py`); a profile may carry
its own.

    forward   conv, linear: FLOPs as counted; bytes = input + output activations + weights
              norm: three passes over its elements (statistics, normalise); pool: input + output;
              element-wise: every input and the output
    backward  conv, linear: twice the FLOPs (input and weight gradients; once for a first layer);
              bytes = two reads of the output gradient, the input, and the input gradient written
              norm: five passes; pool: input + two outputs; element-wise: three passes
Activations take perf/precision.ACTIVATION_BYTES of their precision. On a CUDA device `fp32` runs the
convolutions in TF32 where the device has it (cuDNN's default in PyTorch), matmuls in fp32.

The optimizer is a memory-bound pass over the parameters (its reads and writes per parameter by optimizer);
the loss three element-wise passes; the batch's copy to the device the profile's host link (PCIe, at the
`host_link` efficiency: the training loop copies each batch before its forward, on the same stream); the loader
the profile's `[host] loader_samples_per_s_per_core` over the cores each rank's workers get (unpriced, and said
so, without it)."""

from __future__ import annotations

import math
from typing import Any

from scaletrain.perf.hardware import Hardware, host_copy_time, roofline_time
from scaletrain.perf.memory import TRACED_BYTES
from scaletrain.perf.precision import ACTIVATION_BYTES
from scaletrain.predict import model as M
from scaletrain.predict import workers as W
from scaletrain.predict.kinds import GROUP
from scaletrain.predict.ops import Op, Workload

# fp32 values read and written per parameter by one optimizer step (parameter, gradient, state)
OPTIMIZER_PASSES = {"sgd": 5, "nesterov": 5, "adagrad": 5, "adamw": 7, "plain-sgd": 3}
COPY_NOTE = ("the batch's copy to the device is not priced: the profile gives no [host] pcie_bytes_per_s "
             "(docs/perf.md)")
SIXTEEN_BIT_NOTE = ("16-bit on a CUDA device: the roofline's speed is an upper bound. On one H200 (docs/predict-"
                    "validation.md) eager 16-bit training ran 1.15-1.75x its TF32 speed where the roofline gives "
                    "2.2-3.7x, and its predicted samples/s were 7-28% too high for ResNet-50 at batch 256, 68-85% at "
                    "batch 64 and for ResNet-18 and VGG-16")
LOADER_NOTE = ("the input pipeline is not priced: the profile gives no [host] loader_samples_per_s_per_core "
               "(measure it on a node with `scaletrain calibrate --only loader`, docs/perf.md)")


def conv_precision(hw: Hardware, precision: str, kind: str) -> str:
    """The peak an op runs at: fp32 convolutions on a CUDA device with TF32 run in TF32 (cuDNN's default)."""
    if precision == "fp32" and kind in ("conv", "dwconv") and hw.kind == "cuda" and hw.supports("tf32"):
        return "tf32"
    return precision


def op_elements(op: Op) -> tuple[int, int]:
    """(input elements, output elements) of one traced op."""
    f, out = op.features, op.out_bytes // TRACED_BYTES
    if op.kind == "conv":
        return f["n"] * f["cin"] * f["h"] * f["w"], out
    if op.kind in ("dwconv", "pool", "avgpool"):
        return f["n"] * f["c"] * f["h"] * f["w"], out
    if op.kind == "linear":
        return f["n"] * f["fin"], out
    if op.kind == "norm":
        return f["n"] * f["c"] * f["hw"], out
    if op.kind == "eltwise":
        return f["elements"] * f["inputs"], out
    return 0, 0


def op_bytes(op: Op, precision: str) -> tuple[float, float]:
    """(forward, backward) bytes of device memory one op moves."""
    a = ACTIVATION_BYTES.get(precision, 4)
    x, y = op_elements(op)
    w = 4 * sum(op.param_numels)
    if op.kind in ("conv", "dwconv", "linear"):
        return (x + y) * a + w, (2 * y + x * (1 + int(op.needs_input_grad))) * a + 2 * w
    if op.kind == "norm":
        return 3 * x * a + w, 5 * x * a + 2 * w
    if op.kind in ("pool", "avgpool"):
        return (x + y) * a, (x + 2 * y) * a
    if op.kind == "eltwise":
        return (x + y) * a, 3 * y * a
    return 0.0, 0.0


def op_cost(op: Op, hw: Hardware, precision: str) -> M.OpCost:
    grads = [4 * n for n in op.param_numels]
    if op.kind == "view":
        return M.OpCost(0.0, 0.0, grads, "none", "memory", kind=op.kind)
    group = GROUP.get(op.kind, "memory")
    peak = conv_precision(hw, precision, op.kind) if group == "compute" else precision
    fwd_bytes, bwd_bytes = op_bytes(op, precision)
    bwd_flops = op.flops * (2 if op.needs_input_grad else 1)
    fwd = roofline_time(op.flops, fwd_bytes, hw, peak)
    if op.backward_only:  # a sum of gradients in backward: one element-wise add
        return M.OpCost(0.0, fwd, grads, "roofline", group, kind=op.kind)
    bwd = roofline_time(bwd_flops, bwd_bytes, hw, peak, kernels=2 if group == "compute" else 1)
    return M.OpCost(fwd, bwd, grads, "roofline", group, kind=op.kind)


class DatasheetPredictor:
    """What points.py prices with on a data-sheet basis: the Predictor's interface, from a profile alone."""

    cal = None
    probe = None
    without: frozenset[str] = frozenset()  # a data sheet stacks none of a calibration's corrections

    def __init__(self, hardware: Hardware, network: dict[str, Any]) -> None:
        self.hardware, self.network = hardware, network
        self.notes: list[str] = []
        self._costs: dict[tuple, tuple[Workload, list[M.OpCost]]] = {}

    @property
    def cores(self) -> int:
        return self.hardware.cpu_cores or self.hardware.count

    def op_costs(self, workload: Workload, precision: str, threads: int, now: bool = True) -> list[M.OpCost]:
        if precision in ("fp16", "bf16") and self.hardware.kind == "cuda" and SIXTEEN_BIT_NOTE not in self.notes:
            self.notes.append(SIXTEEN_BIT_NOTE)
        key = (id(workload), precision)  # kept per workload, as the Predictor keeps its own
        held = self._costs.get(key)
        if held is None or held[0] is not workload:
            held = self._costs[key] = (workload, [op_cost(op, self.hardware, precision) for op in workload.ops])
        return held[1]

    def codec_s(self, numel: int, threads: int) -> float:
        """Seconds of fp16 gradient compression's two casts of `numel` fp32 elements: reading 4 and writing 2 bytes
        each, then back, two memory-bound kernels."""
        return roofline_time(0, 12 * numel, self.hardware, "fp32", kernels=2)

    def loss_s(self, batch: int, classes: int, precision: str, threads: int, now: bool = True) -> tuple[float, float]:
        t = roofline_time(0, 3 * 2 * batch * classes * 4, self.hardware, precision, kernels=3)
        return t, t

    def fresh_s(self, nbytes: int, cfg) -> float:
        return 0.0  # a GPU's caching allocator keeps what a step frees

    def copy_s(self, nbytes: int, threads: int) -> float:
        """Seconds to copy `nbytes` once on the device: read and written at its memory bandwidth."""
        return roofline_time(0, 2 * nbytes, self.hardware, "fp32" if self.hardware.supports("fp32") else
                             next(iter(self.hardware.peak_flops)))

    def optimizer_law(self, name: str, threads: int, now: bool = True):
        hw, passes = self.hardware, OPTIMIZER_PASSES.get(name, 5)

        def seconds(tensors: int, numel: int) -> float:
            # torch's foreach kernels: one launch per few dozen tensors and pass
            kernels = passes * max(1, math.ceil(tensors / 32))
            return roofline_time(0, passes * 4 * numel, hw, "fp32" if hw.supports("fp32") else
                                 next(iter(hw.peak_flops)), kernels=kernels)
        return seconds

    def loader_sample_s(self, dataset: str, image_size: int, source_pixels: int | None, batch: int = 32) -> float:
        """Seconds of one core per sample; 0 for synthetic tensors, and (noted) where the profile has no rate."""
        if dataset.startswith("synthetic"):
            return 0.0
        rate = self.hardware.loader_samples_per_s_per_core
        if rate is None:
            if LOADER_NOTE not in self.notes:
                self.notes.append(LOADER_NOTE)
            return 0.0
        return 1.0 / rate

    def batch_copy_s(self, nbytes: int) -> float:
        """Seconds to copy a batch of `nbytes` to the device over its host link (noted where unpriced)."""
        t = host_copy_time(nbytes, self.hardware)
        if t is None:
            if COPY_NOTE not in self.notes:
                self.notes.append(COPY_NOTE)
            return 0.0
        return t

    def workers(self) -> W.Workers:
        """Workers on a data sheet: one core each, no hand-over priced (the profile gives a core's rate only)."""
        return W.Workers()

    def loop(self, local_ranks: int) -> M.Loop:
        return M.Loop()

    def regression_errors(self) -> dict[str, Any]:
        return {}

    def peak_flops(self, precision: str) -> float:
        """The fastest rate the device's data sheet gives an op of this run (TF32 for fp32 convolutions)."""
        return self.hardware.peak_flops[conv_precision(self.hardware, precision, "conv")]

    def device_memory(self) -> int:
        return self.hardware.memory_bytes

    def memory_kind(self) -> str:
        return self.hardware.kind
