"""Peak memory of this process: CUDA allocator peak on a GPU, resident set size on CPU."""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, kind): kind is "cuda" (max allocated by tensors) or "rss" (peak resident set size)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024), "rss"  # Linux reports KiB
