"""A DDP communication hook and its state (and their checkpoint): --compress's, or a strategy's own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from scaletrain.comm.compress import make_compressor
from scaletrain.comm.hooks import CompressState, compressed_hook, powersgd_state
from scaletrain.distributed.group import current_world_size
from scaletrain.perf.wire import allreduce_bytes, powersgd_bytes

@dataclass
class PowerSGD:
    """Hook state: PyTorch's PowerSGDState, and the profiler's recorder to report bytes to."""

    psgd: Any
    recorder: Any = None


@dataclass
class CommSetup:
    """The hook DDP runs for every bucket (None: DDP's own all-reduce) and the state it keeps."""

    hook: Callable | None = None
    state: Any = None

    def state_dict(self) -> dict[str, Any]:
        """Per-rank state to checkpoint: compressor residuals and RNG; PowerSGD's step and RNG."""
        if isinstance(self.state, CompressState):
            return {"compressor": self.state.compressor.state_dict()}
        if isinstance(self.state, PowerSGD):
            s = self.state.psgd
            return {"powersgd": {"iter": s.iter, "rng": _rng_tensor(s.rng)}}
        return {}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        if "compressor" in state and isinstance(self.state, CompressState):
            self.state.compressor.load_state_dict(state["compressor"])
        if "powersgd" in state and isinstance(self.state, PowerSGD):
            # PyTorch keys PowerSGD's error and P/Q memories by bucket index, and a restarted DDP buckets
            # differently for its first step: restoring them could meet the wrong shapes. So the step
            # counter and random stream resume, the error feedback starts again (docs/strategies.md).
            saved, s = state["powersgd"], self.state.psgd
            s.iter = saved["iter"]
            _set_rng(s.rng, saved["rng"])


def compression(compress: str | tuple | None, seed: int, model: torch.nn.Module | None = None) -> CommSetup:
    """The hook for `--compress` (none: DDP's own all-reduce)."""
    compressor = make_compressor(compress, seed=seed)
    if compressor is None:
        return CommSetup()
    if isinstance(compressor, tuple):  # ("powersgd", rank): PyTorch's own hook
        return CommSetup(powersgd_timed, PowerSGD(powersgd_state(compressor[1], seed)))
    params = {id(p): i for i, p in enumerate(model.parameters())} if model is not None else {}
    return CommSetup(compressed_hook, CompressState(compressor, params))


def powersgd_timed(state, bucket):
    """PyTorch's PowerSGD hook, reporting the bytes it sends: the P and Q factors of the matrices it
    compresses and the rest uncompressed (all-reduced), or the whole bucket before compression starts."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    if state.recorder is not None:
        state.recorder.note_wire(allreduce_bytes(_powersgd_payload(state.psgd, bucket), current_world_size()))
    return powersgd.powerSGD_hook(state.psgd, bucket)


def _powersgd_payload(state, bucket) -> int:
    buffer = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        return buffer.numel() * buffer.element_size()
    # one dtype per DDP bucket: the buffer's element size is every gradient's
    return powersgd_bytes([g.shape for g in bucket.gradients()], state.matrix_approximation_rank,
                          buffer.element_size())


def _rng_tensor(rng) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = rng.get_state()
    return {"keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos), "has_gauss": int(has_gauss),
            "cached": float(cached)}


def _set_rng(rng, saved: dict[str, Any]) -> None:
    rng.set_state(("MT19937", saved["keys"].numpy().astype("uint32"), saved["pos"], saved["has_gauss"],
                   saved["cached"]))
