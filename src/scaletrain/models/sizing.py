"""Width scaling and the spatial-size arithmetic behind each model's minimum image size."""

from __future__ import annotations

from collections.abc import Iterable

from scaletrain.errors import UserError

# One spatial window: (kernel, stride, padding), as for a conv or pool layer in floor mode.
Window = tuple[int, int, int]


def scaled(channels: int, width: float) -> int:
    """`channels` times the width multiplier, rounded, never below 1."""
    return max(1, int(round(channels * width)))


def window_out(size: int, window: Window) -> int:
    """Side length after one window (PyTorch's floor formula), 0 when the window does not fit."""
    kernel, stride, padding = window
    if size + 2 * padding < kernel:
        return 0
    return (size + 2 * padding - kernel) // stride + 1


def final_size(size: int, windows: Iterable[Window]) -> int:
    """Side length after applying `windows` in order, 0 as soon as one does not fit."""
    for window in windows:
        size = window_out(size, window)
        if size < 1:
            return 0
    return size


def min_input_size(windows: Iterable[Window], limit: int = 4096) -> int:
    """Smallest square side for which every window fits (output side >= 1)."""
    windows = list(windows)
    # The output side is monotone in the input side, so the first size that fits is the minimum.
    for size in range(1, limit + 1):
        if final_size(size, windows) >= 1:
            return size
    raise ValueError(f"no input size up to {limit} fits these windows")


def size_error(name: str, minimum: int, got: int) -> UserError:
    """The one-line error for an image too small for `name`, suggesting a power-of-two size."""
    suggest = 1
    while suggest < minimum:
        suggest *= 2
    return UserError(
        f"{name} needs images of at least {minimum}x{minimum} (got {got}): "
        f"use --image-size {suggest} or another model"
    )
