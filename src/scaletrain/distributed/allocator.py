"""glibc malloc's mmap and trim thresholds, fixed once at the start of every scaletrain process.

glibc serves an allocation above its mmap threshold (128 KiB at first) with fresh pages from the kernel and
unmaps them on free; each such free raises the threshold a little (its "dynamic" threshold), and memory freed
at the top of the heap beyond the trim threshold goes back to the kernel. A training step allocates and frees
the same large tensors step after step: VGG-11's 512-channel 3x3 convolutions allocate a 9.4 MB weight
gradient per micro-batch. Until glibc's dynamic thresholds have caught up with them, every one is paged in
anew, and how far they have caught up depends on the process's history: the same VGG-11 block measured
45-80 ms per step in one process, 46-49 ms with the thresholds fixed (docs/bench-pipeline.md). A step time
that depends on what the process did before cannot be measured, predicted or compared, so every entry point
(the CLI, each rank, the benchmarks) calls `settle()` first, as the `MALLOC_MMAP_THRESHOLD_` and
`MALLOC_TRIM_THRESHOLD_` environment variables would at start-up.

Left alone: `SCALETRAIN_MALLOC=default` (glibc's own behaviour, e.g. to measure what this buys), thresholds
the user set through those environment variables, and C libraries other than glibc (macOS, musl).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

MMAP_THRESHOLD = 32 * 2**20  # glibc's largest: every tensor of a vision model's step below it reuses heap memory
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: up to 2 GiB freed at the heap top is kept for the next step
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
OPT_OUT = "SCALETRAIN_MALLOC"
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_settled: dict[str, Any] | None = None


def settle() -> dict[str, Any]:
    """Fix the thresholds in this process (once; later calls return the first call's record): what was done,
    for summary.json's placement."""
    global _settled
    if _settled is None:
        _settled = _apply()
    return _settled


def retained_below() -> int | None:
    """The size under which a rank's freed memory stays with its process (glibc's heap below the mmap threshold,
    with the trim threshold past what a step frees) when its ranks fix the thresholds, else None (unknown)."""
    if _glibc() is None or os.environ.get(OPT_OUT, "").strip().lower() == "default" or \
            any(os.environ.get(name) for name in USER_VARIABLES):
        return None
    return MMAP_THRESHOLD


def _apply() -> dict[str, Any]:
    libc = _glibc()
    if libc is None:
        return {"malloc": "not glibc: left as it is"}
    if os.environ.get(OPT_OUT, "").strip().lower() == "default":
        return {"malloc": f"glibc defaults ({OPT_OUT}=default)"}
    given = [name for name in USER_VARIABLES if os.environ.get(name)]
    if given:
        return {"malloc": f"glibc, as set by {' and '.join(given)}"}
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not ok:
        return {"malloc": "glibc refused the thresholds: left as it is"}
    return {"malloc": "glibc, thresholds fixed", "mmap_threshold_bytes": MMAP_THRESHOLD,
            "trim_threshold_bytes": TRIM_THRESHOLD}


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None
