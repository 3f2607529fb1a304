"""The bytes autograd keeps for backward, counted as autograd keeps them (docs/perf.md, "Memory per rank").

Every tensor an operation saves for its backward passes through `torch.autograd.graph.saved_tensors_hooks`;
`SavedBytes` adds each storage's size once (an in-place ReLU saves the storage its batch norm's output
lives in: one storage, counted once) and leaves out the parameters and buffers, which the memory model
counts on their own. Run on the meta device it allocates nothing, at any batch and image size.

Summing every layer's output instead counts what autograd never keeps (the output of a batch norm that an
in-place ReLU overwrites, a view, the last logits) and misses what it keeps twice; on ResNet-50 at 224 px
that sum is 1.8x the CUDA allocator's measured peak, the saved bytes within 2% of it
(docs/predict-validation.md, "A held-out GPU")."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class SavedBytes:
    """Inside `with SavedBytes(model) as saved:` (grad enabled), `saved.total` is the bytes of the distinct
    storages that autograd has saved for backward so far, the model's parameters and buffers excluded."""

    def __init__(self, model: nn.Module) -> None:
        self.seen = {_key(t) for t in (*model.parameters(), *model.buffers())}
        self.total = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _key(t)
        if key not in self.seen:
            self.seen.add(key)
            self.total += t.untyped_storage().nbytes()
        return t

    def __enter__(self) -> "SavedBytes":
        self._grad = torch.enable_grad()
        self._grad.__enter__()
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        self._grad.__exit__(*exc)


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
