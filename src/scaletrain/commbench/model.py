"""commbench's --sizes as users write them. The bandwidths and the alpha-beta model commbench reports
are perf/alphabeta.py."""

from __future__ import annotations

SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """`1K`, `64M`, `4096` -> bytes, rounded down to whole float32 elements (4 bytes); under 4 gives 0 or less
    (the caller refuses it). ValueError or OverflowError for what is not a size."""
    t = text.strip().upper().removesuffix("B")
    unit = t[-1] if t and t[-1] in SIZE_UNITS else ""
    value = int(float(t[: len(t) - len(unit)]) * SIZE_UNITS[unit])
    return value - value % 4
