"""Gradient compressors: one interface for all-reduce (linear codes) and all-gather (the others).

A compressor turns a flat gradient buffer into a payload of tensors and back:

    linear   (fp16, bf16):          encode -> all-reduce(sum) -> decode        each rank sends 2 (P-1)/P x payload
    gathered (topk, sign, qsgd):    encode -> all-gather      -> decode(all)   each rank sends (P-1) x payload

`decode` returns the mean over ranks of what each rank sent. Top-k and sign keep what they did not send
in a per-buffer residual (error feedback) and add it to the next step's gradient, so nothing is lost,
only delayed; the residuals are state, saved in the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from scaletrain.comm.spec import parse_compress
from scaletrain.perf.wire import topk_count

Payload = list[torch.Tensor]


def payload_bytes(payload: Payload) -> int:
    return sum(t.numel() * t.element_size() for t in payload)


@dataclass
class Cast:
    """fp16/bf16: divide by the world size first (the sum stays in range), then cast; linear."""

    dtype: torch.dtype
    linear = True

    def encode(self, grad: torch.Tensor, key: Key, world: int) -> Payload:
        return [(grad / world).to(self.dtype)]

    def decode(self, summed: Payload, numel: int, world: int) -> torch.Tensor:
        return summed[0].to(torch.float32)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


Key = int | tuple[tuple[int, int], ...]
"""What a buffer holds: an int names a whole buffer; ((param index, numel), ...) names its parameters in
order, so residuals are kept per parameter and survive DDP re-bucketing (after its first step, and on
every restart from a checkpoint)."""


@dataclass
class ErrorFeedback:
    """Residuals of what was not sent, added to the next gradient of the same parameters."""

    residuals: dict[int, torch.Tensor] = field(default_factory=dict)

    def add(self, grad: torch.Tensor, key: Key) -> torch.Tensor:
        parts = []
        for pid, numel in _segments(key, grad.numel()):
            residual = self.residuals.get(pid)
            parts.append(residual if residual is not None and residual.numel() == numel else None)
        if all(part is None for part in parts):
            return grad.clone()
        return grad + torch.cat([part if part is not None else grad.new_zeros(n)
                                 for part, (_, n) in zip(parts, _segments(key, grad.numel()))])

    def keep(self, key: Key, residual: torch.Tensor) -> None:
        offset = 0
        for pid, numel in _segments(key, residual.numel()):
            self.residuals[pid] = residual[offset:offset + numel].clone()
            offset += numel

    def state_dict(self) -> dict:
        return {"residuals": {str(k): v.detach().cpu() for k, v in self.residuals.items()}}

    def load_state_dict(self, state: dict, device: torch.device | None = None) -> None:
        self.residuals = {int(k): v.to(device) if device else v for k, v in state.get("residuals", {}).items()}


def _segments(key: Key, numel: int) -> list[tuple[int, int]]:
    return list(key) if isinstance(key, tuple) else [(key, numel)]


@dataclass
class TopK:
    """Send the `ratio` largest-magnitude entries (values + int32 indices), with error feedback."""

    ratio: float
    feedback: ErrorFeedback = field(default_factory=ErrorFeedback)
    linear = False

    def encode(self, grad: torch.Tensor, key: Key, world: int) -> Payload:
        acc = self.feedback.add(grad, key)
        k = topk_count(acc.numel(), self.ratio)
        _, index = acc.abs().topk(k, sorted=False)
        values = acc[index]
        self.feedback.keep(key, acc.index_fill(0, index, 0.0))
        return [values, index.to(torch.int32)]

    def decode(self, gathered: list[Payload], numel: int, world: int) -> torch.Tensor:
        out = torch.zeros(numel, dtype=gathered[0][0].dtype, device=gathered[0][0].device)
        for values, index in gathered:
            out.index_add_(0, index.long(), values)
        return out / world

    def state_dict(self) -> dict:
        return self.feedback.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.feedback.load_state_dict(state)


_SHIFTS = torch.arange(8, dtype=torch.uint8)


def pack_signs(positive: torch.Tensor) -> torch.Tensor:
    """Booleans -> uint8, 8 per byte (padded with zeros)."""
    pad = (-positive.numel()) % 8
    bits = torch.cat([positive, positive.new_zeros(pad)]).view(-1, 8).to(torch.uint8)
    return (bits << _SHIFTS.to(bits.device)).sum(1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """uint8 bytes -> +1/-1 floats."""
    bits = (packed.unsqueeze(1) >> _SHIFTS.to(packed.device)) & 1
    return bits.view(-1)[:numel].to(torch.float32) * 2 - 1


@dataclass
class Sign:
    """1 bit per entry plus one scale (the mean magnitude), with error feedback (EF-signSGD)."""

    feedback: ErrorFeedback = field(default_factory=ErrorFeedback)
    linear = False

    def encode(self, grad: torch.Tensor, key: Key, world: int) -> Payload:
        acc = self.feedback.add(grad, key)
        scale = acc.abs().mean()
        positive = acc >= 0
        self.feedback.keep(key, acc - scale * (positive.to(acc.dtype) * 2 - 1))
        return [pack_signs(positive), scale.reshape(1).to(torch.float32)]

    def decode(self, gathered: list[Payload], numel: int, world: int) -> torch.Tensor:
        return sum(scale * unpack_signs(packed, numel) for packed, scale in gathered) / world

    def state_dict(self) -> dict:
        return self.feedback.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.feedback.load_state_dict(state)


@dataclass
class QSGD:
    """Stochastic quantisation to `levels` levels of |g|/||g|| (Alistarh et al. 2017): unbiased."""

    levels: int
    seed: int = 0
    generator: torch.Generator | None = None
    linear = False

    def _rng(self, device: torch.device) -> torch.Generator:
        if self.generator is None:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(self.seed)
        return self.generator

    def encode(self, grad: torch.Tensor, key: Key, world: int) -> Payload:
        norm = grad.norm()
        scaled = grad.abs() / norm * self.levels if norm > 0 else torch.zeros_like(grad)
        low = scaled.floor()
        up = torch.rand(grad.shape, generator=self._rng(grad.device), device=grad.device) < (scaled - low)
        level = (low + up.to(low.dtype)) * grad.sign()
        dtype = torch.int8 if self.levels <= 127 else torch.int16
        return [level.to(dtype), norm.reshape(1).to(torch.float32)]

    def decode(self, gathered: list[Payload], numel: int, world: int) -> torch.Tensor:
        return sum(level.to(torch.float32) * (norm / self.levels) for level, norm in gathered) / world

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()} if self.generator is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if "generator" in state:
            self.generator = torch.Generator()
            self.generator.set_state(state["generator"])


def make_compressor(spec: str | tuple | None, seed: int = 0):
    """The compressor for a --compress value, parsed (config's `compression`) or as written; None for none;
    ("powersgd", rank) for PyTorch's hook."""
    parsed = parse_compress(spec) if isinstance(spec, str) else spec
    if parsed is None:
        return None
    name, arg = parsed
    if name in ("fp16", "bf16"):
        return Cast(torch.float16 if name == "fp16" else torch.bfloat16)
    if name == "sign":
        return Sign()
    if name == "topk":
        return TopK(float(arg))
    if name == "qsgd":
        return QSGD(int(arg), seed=seed)
    return ("powersgd", int(arg))
