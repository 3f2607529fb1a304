"""The level-2 cache of this machine's cores: how many of an op's bytes a training step brings to it cold.

An op timed alone, call after call, finds its inputs, weights and output in its cores' L2 whenever they fit there;
inside a step the ops before it have pushed them out, and each op pays for fetching them again (the loop's
`per_cold_byte`, predictor.Predictor._group_factors). What does not fit was fetched in the isolated timing too.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

FALLBACK = 2 * 2 ** 20
"""Bytes of L2 per core where the system does not say (no sysfs): a common server core's."""


@lru_cache(maxsize=4)
def l2_bytes(cpu: int = 0) -> int:
    """Bytes of the level-2 cache of `cpu` (Linux sysfs), FALLBACK where it cannot be read."""
    root = Path(f"/sys/devices/system/cpu/cpu{cpu}/cache")
    for index in sorted(root.glob("index*")):
        try:
            if (index / "level").read_text().strip() == "2":
                return parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
    return FALLBACK


def parse_size(text: str) -> int:
    """sysfs's cache size ("2048K", "1M", "512") in bytes."""
    text = text.strip().upper()
    scale = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def cold_bytes(op_bytes: float, threads: int, l2: int) -> float:
    """Of an op's `op_bytes`, those a step brings to it cold that its isolated timing found in cache: up to the L2 of
    the `threads` cores it runs on (each thread's share passes through its own core's cache)."""
    return min(op_bytes, l2 * max(1, threads))
