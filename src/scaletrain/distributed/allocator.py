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

That is the `steady` policy. Its price is memory: what a step frees under 32 MiB stays with the process, and the
heap's high-water grows over the first steps as freed holes of one size are not reused for another (ResNet-18
on 2 tiles of a 1,920 px image, checkpointed: 1.1 GB live at the step's peak, 1.9 GB resident). The `lean` policy
(`--allocator lean`) serves every allocation of 1 MiB and more from pages of its own and gives them back on
free, so the resident peak is what is live; the price is the kernel's fresh pages, step after step (huge pages
where the kernel allows them on request: `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` in the ranks' environment,
which glibc reads at a process's start). `auto` is steady unless a --memory-per-device budget is met only by
lean (distributed/launch/preflight.py). docs/perf.md has the figures.

Left alone: `SCALETRAIN_MALLOC=default` (glibc's own behaviour, e.g. to measure what this buys), thresholds
the user set through those environment variables, and C libraries other than glibc (macOS, musl).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from typing import Any

THRESHOLDS = {  # (mmap, trim) threshold in bytes of each policy
    # glibc's largest mmap threshold: every tensor of a vision model's step below it reuses heap memory; mallopt
    # takes an int: up to 2 GiB freed at the heap top is kept for the next step
    "steady": (32 * 2**20, 2**31 - 1),
    "lean": (2**20, 2**20),  # 1 MiB and more: pages of its own, returned on free (and the heap's top with them)
}
HUGE_PAGES = "glibc.malloc.hugetlb=1"  # the lean policy's ranks: its fresh pages as huge pages where allowed
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # mallopt's parameter numbers (malloc.h)
MMAP_MAX = 65536  # glibc's own M_MMAP_MAX
OPT_OUT = "SCALETRAIN_MALLOC"
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_settled: dict[str, Any] | None = None


def settle(policy: str | None = None) -> dict[str, Any]:
    """Fix the thresholds of `policy` (steady or lean; auto, unresolved, is steady; None: what this process has,
    steady at first) in this process, again only when the policy changes: what was done, for summary.json's
    placement."""
    global _settled
    if policy is None and _settled is not None:
        return _settled
    policy = _policy(policy or "steady")
    if _settled is None or _settled.get("allocator", "steady") != policy:
        _settled = _apply(policy)
    return _settled


@contextlib.contextmanager
def from_heap() -> Iterator[bool]:
    """Inside, every allocation is served from the heap (glibc's M_MMAP_MAX 0), as a steady training step's come to
    be: above the mmap threshold a tensor is first given pages of its own, but the heap keeps what the step frees
    and its free chunks grow until they serve the largest too (ResNet-50 at 224 px, batch 32: 1.24 million fresh
    pages in its first forward, none from the seventh step on). Yields whether it applied (glibc, steady thresholds
    fixed here); what the heap took inside stays with it afterwards, up to the trim threshold."""
    libc = _glibc()
    applies = libc is not None and (_settled or {}).get("allocator") == "steady" and not _left_alone()
    if applies:
        libc.mallopt(M_MMAP_MAX, 0)
    try:
        yield applies
    finally:
        if applies:
            libc.mallopt(M_MMAP_MAX, MMAP_MAX)


def retained_below(policy: str = "steady") -> int | None:
    """The size under which a rank's freed memory stays with its process (glibc's heap below the mmap threshold,
    with the trim threshold past what a step frees) when its ranks fix the thresholds of `policy`, else None
    (unknown)."""
    if _left_alone():
        return None
    return THRESHOLDS[_policy(policy)][0]


def rank_environment(policy: str) -> dict[str, str]:
    """What a rank's environment needs at its start for `policy` (glibc reads its tunables only then): lean's huge
    pages, unless the user gave GLIBC_TUNABLES or opted out."""
    if _policy(policy) != "lean" or _left_alone() or os.environ.get("GLIBC_TUNABLES"):
        return {}
    return {"GLIBC_TUNABLES": HUGE_PAGES}


def resolved(policy: str, budget: bool, device_type: str) -> str | None:
    """The policy a run of `policy` takes: `auto` is lean for a CPU run with a --memory-per-device budget, else
    steady (distributed/launch/preflight.planned); None on a GPU, whose tensors glibc does not hold."""
    if device_type != "cpu":
        return None
    return ("lean" if budget else "steady") if policy == "auto" else policy


def _policy(policy: str) -> str:
    return "steady" if policy == "auto" else policy


def _left_alone() -> bool:
    return _glibc() is None or os.environ.get(OPT_OUT, "").strip().lower() == "default" or \
        any(os.environ.get(name) for name in USER_VARIABLES)


def _apply(policy: str) -> dict[str, Any]:
    libc = _glibc()
    if libc is None:
        return {"malloc": "not glibc: left as it is"}
    if os.environ.get(OPT_OUT, "").strip().lower() == "default":
        return {"malloc": f"glibc defaults ({OPT_OUT}=default)"}
    given = [name for name in USER_VARIABLES if os.environ.get(name)]
    if given:
        return {"malloc": f"glibc, as set by {' and '.join(given)}"}
    mmap, trim = THRESHOLDS[policy]
    ok = libc.mallopt(M_MMAP_THRESHOLD, mmap) == 1 and libc.mallopt(M_TRIM_THRESHOLD, trim) == 1
    if not ok:
        return {"malloc": "glibc refused the thresholds: left as it is"}
    huge = HUGE_PAGES in os.environ.get("GLIBC_TUNABLES", "")
    return {"malloc": "glibc, thresholds fixed", "allocator": policy, "mmap_threshold_bytes": mmap,
            "trim_threshold_bytes": trim, **({"huge_pages": True} if huge else {})}


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None
