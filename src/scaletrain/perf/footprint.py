"""Memory a training request needs per process, estimated before anything large is allocated (per layout:
comm/memory.py asks the strategy; docs/perf.md, "Memory per rank, per layout").

The model is built on PyTorch's `meta` device (shapes only, no storage) and walked once on a meta batch
(perf/walk.walk, the walk predict and the graph use); the activations are the bytes autograd saves for
backward in that pass (perf/saved.py). Parameters count four times
over with a momentum optimizer (weights, gradients, momentum, the gradient bucket DDP keeps), five with
AdamW, three with plain SGD (perf/memory.py, shared with predict and split). The digits dataset is held in memory resized to the image size, once per process.
It is a floor, not a bound: the allocator, the framework and the loader add to it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from scaletrain import fmt
from scaletrain.errors import UserError
from scaletrain.perf.blocks import group
from scaletrain.perf.memory import PARTS, TRACED_BYTES, activations_at, data_parallel_copies
from scaletrain.perf.peak import BlockBytes, block_bytes, peak
from scaletrain.perf.precision import param_bytes
from scaletrain.perf.walk import walk

DIGITS_SAMPLES = 1797


@dataclass(frozen=True)
class Footprint:
    """Bytes per process: parameters with their training state, activations at the step's peak, the dataset,
    the loader's batches and the process itself (interpreter, torch, the communication library)."""

    params: int = 0
    activations: int = 0
    dataset: int = 0
    batches: int = 0
    runtime: int = 0

    @property
    def total(self) -> int:
        return self.params + self.activations + self.dataset + self.batches + self.runtime

    def parts(self) -> dict[str, int]:
        return {PARTS[k]: v for k, v in vars(self).items()}


@dataclass(frozen=True)
class ModelMemory:
    """A model's memory facts at the batch one rank computes, from one walk on the meta device: its blocks'
    bytes (perf/peak.py) at the run's precision, its parameter bytes, one input batch's bytes."""

    blocks: list[BlockBytes]
    param_bytes: int
    input_bytes: int
    optimizer: str
    checkpointed: bool | frozenset[str] = False  # --checkpoint-activations: every block, none, or those named
    retained_below: int | None = None  # the allocator keeps freed tensors below this size (perf/peak.py)
    room: int | None = None
    """What the layout's own part may hold under --memory-per-device (the budget less comm/memory's margin, the
    dataset, the loader's batches and the process); None without a budget. A pipeline splits within it."""

    def recomputed(self, block: BlockBytes) -> bool:
        """Whether checkpointing recomputes `block`."""
        return self.checkpointed if isinstance(self.checkpointed, bool) else block.name in self.checkpointed

    def activations(self, blocks: list[BlockBytes] | None = None) -> int:
        """The peak of `blocks` (default all of them) with or without checkpointing."""
        return peak(self.blocks if blocks is None else blocks, self.checkpointed, self.retained_below)

    def state_bytes(self, param_bytes: int | None = None, buckets: bool = True) -> int:
        """Weights, gradients, optimizer state (and DDP's bucket copy) of `param_bytes` (default all)."""
        held = self.param_bytes if param_bytes is None else param_bytes
        return held * data_parallel_copies(self.optimizer, buckets)


def model_memory(factory, batch_size: int, sample_shape: tuple[int, ...], optimizer: str, precision: str,
                 checkpointed: bool | frozenset[str] = False, retained_below: int | None = None,
                 walked: tuple[list, int] | None = None) -> ModelMemory | None:
    """The model's ModelMemory at `batch_size` x `sample_shape`; None when it cannot be built or run on the meta
    device (a user model may not allow it). `walked`: model_blocks' result for this batch and shape, which no
    optimizer, precision or allocator changes (comm/memory.cached_walk keeps it)."""
    walked = walked or model_blocks(factory, batch_size, sample_shape)
    if walked is None:
        return None
    traced, count = walked
    size = param_bytes(precision)
    at = [BlockBytes(b.name, activations_at(b.saved, precision), activations_at(b.input, precision),
                     activations_at(b.largest, precision), b.params // TRACED_BYTES * size, b.flops,
                     None if b.inner is None else activations_at(b.inner, precision),
                     None if b.tiled_inner is None else activations_at(b.tiled_inner, precision), b.layers,
                     None if b.stem_inner is None else activations_at(b.stem_inner, precision))
          for b in traced]
    return ModelMemory(at, count * size, batch_size * math.prod(sample_shape) * size, optimizer, checkpointed,
                       retained_below)


def meta_model(factory) -> torch.nn.Module | None:
    """The factory's model built on the meta device (no memory), or None where it cannot be."""
    try:
        with torch.device("meta"):
            return factory()
    except UserError:
        raise
    except Exception:  # noqa: BLE001 - a user model may not allow meta tensors: the estimate stays silent
        return None


def model_blocks(factory, batch_size: int, sample_shape: tuple[int, ...], model: torch.nn.Module | None = None
                 ) -> tuple[list, int] | None:
    """The model's blocks as traced (fp32 bytes) at `batch_size` x `sample_shape`, and its parameter count; None
    when it cannot be built or run on the meta device. `model`: the factory's model already built on meta."""
    try:
        with torch.device("meta"):
            model = model if model is not None else factory()
            graph = walk(model, tuple(sample_shape), batch_size)
    except UserError:
        raise
    except Exception:  # noqa: BLE001 - whatever a model does on meta tensors, the estimate just stays silent
        return None
    entering = batch_size * math.prod(sample_shape) * TRACED_BYTES
    return block_bytes(graph, group(graph, "block"), entering), sum(p.numel() for p in model.parameters())


RANK_PROCESS = {"steady": 411 * 2 ** 20, "lean": 345 * 2 ** 20}
"""A CPU rank's own resident memory besides its model and data (the interpreter, torch, scaletrain, its process
group, DDP's reducer, the profiler, the loader), per allocator policy. Measured here: under steady a rank of a
2-rank DDP run of ResNet-18 at 64 px peaked at 582 MiB, of which 171 MiB were the parameters' state (torch 2.13
CPU, 2026-11-26); under lean the same run at batch 8 peaked 663-664 MiB where the model's parts came to 318 MiB
(345-347), and ResNet-20 at 64 px, batch 16, every strategy, 65-75 MiB under the steady constant (2026-11-27,
benchmarks/memory_strategies.py). Constants, not this process's size: every process that plans (the launcher,
each rank under torchrun) plans the same."""


def runtime_bytes(device_type: str, policy: str | None = "steady") -> int:
    """What a rank's process holds besides its model and data: RANK_PROCESS under the allocator `policy` on a CPU
    (glibc's own, None: steady's); 0 on a GPU, whose memory holds none of it."""
    return 0 if device_type == "cuda" else RANK_PROCESS.get(policy or "steady", RANK_PROCESS["steady"])


def dataset_bytes(dataset: str, image_size: int, channels: int = 1) -> int:
    """Bytes a process holds for the dataset itself: digits is resized into memory, the others load lazily."""
    return DIGITS_SAMPLES * channels * image_size * image_size * 4 if dataset == "digits" else 0


def check_forward_fits(factory, batch_size: int, in_channels: int, image_size: int, what: str, hint: str) -> None:
    """Refuse, before anything is allocated, one forward pass without gradients (graph, split and predict
    run one here to trace a model) that this machine's memory cannot hold: its fp32 parameters, the input
    batch and the largest activation, from the meta-device model (a floor; silent when meta cannot run it)."""
    meta = _meta_forward(factory, batch_size, in_channels, image_size)
    available = available_bytes("cpu")
    if meta is None or available is None:
        return
    params, largest, _saved = meta
    weights, data = 4 * params, 4 * batch_size * in_channels * image_size ** 2 + largest
    if weights + data > available:
        raise UserError(f"{what} needs at least {fmt.size(weights + data)} of memory here (parameters "
                        f"{fmt.size(weights)}, the input and its largest activation {fmt.size(data)}) but {fmt.size(available)} is "
                        f"available: {hint}")


def _meta_forward(factory, batch_size: int, in_channels: int, image_size: int) -> tuple[int, int, int] | None:
    """(parameters, the largest activation's bytes, the bytes autograd saves for backward in float32) of one
    training forward pass on the meta device, from the one walk over the model (perf/walk.walk); None when
    the model cannot be built or run there."""
    try:
        with torch.device("meta"):  # tensors the forward makes itself are meta tensors too
            model = factory()
            graph = walk(model, (in_channels, image_size, image_size), batch_size)
    except UserError:
        raise
    except Exception:  # noqa: BLE001 - whatever a model does on meta tensors, the estimate just stays silent
        return None
    largest = max((n.out_bytes for n in graph.leaves() if n.op != "placeholder"), default=0)
    return sum(p.numel() for p in model.parameters()), largest, graph.saved_bytes or 0


def available_bytes(device_type: str) -> int | None:
    """Memory a process can hope for: the GPU's total on CUDA, MemAvailable (else total RAM) on CPU."""
    if device_type == "cuda":
        return torch.cuda.get_device_properties(0).total_memory
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(need: Footprint, processes: int, available: int | None, device_type: str, hint: str) -> None:
    """Refuse a request whose floor estimate exceeds the memory there is (per GPU; shared RAM on a CPU)."""
    if available is None:
        return
    total = need.total * (1 if device_type == "cuda" else processes)
    if total <= available:
        return
    parts = [f"{name} {fmt.size(v)}" for name, v in need.parts().items() if v]
    where = "per GPU" if device_type == "cuda" else f"for {processes} process{'es' if processes > 1 else ''}"
    raise UserError(f"this run needs at least {fmt.size(total)} of memory {where} ({', '.join(parts)} each) but "
                    f"{fmt.size(available)} is available: {hint}")
