"""Results kept for the process, per the objects they were computed from: a plan prices thousands of candidates
that share most of their work (one model's walks, a layout's split, the same step with other loader workers).

Keyed by those objects' identities (a basis, a model), which are held beside the result, so that an id that a new
object reuses is never taken for the old one's; the result used least recently goes first once `size` are kept."""

from __future__ import annotations

from typing import Any, Callable


class Kept:
    def __init__(self, size: int) -> None:
        self.size = size
        self._held: dict[tuple, tuple[tuple, Any]] = {}

    def get(self, owners: tuple, key: tuple, compute: Callable[[], Any]) -> Any:
        """compute() once per `owners` (objects, by identity) and `key` (values)."""
        k = (tuple(id(o) for o in owners), key)
        held = self._held.pop(k, None)
        if held is None or any(a is not b for a, b in zip(held[0], owners)):
            if len(self._held) >= self.size:
                self._held.pop(next(iter(self._held)))
            held = (owners, compute())
        self._held[k] = held  # (the most recent last)
        return held[1]

    def clear(self) -> None:
        self._held.clear()
