"""The step profiler: per-rank phase timelines, gradient communication timing, torch.profiler windows.

`StepProfiler` is imported on first use, so that the pure parts (`timeline`) load without torch.
"""

from __future__ import annotations

from typing import Any

from scaletrain.analysis.timeline import PHASES

__all__ = ["StepProfiler", "PHASES"]


def __getattr__(name: str) -> Any:
    if name == "StepProfiler":
        from scaletrain.profiler.step_profiler import StepProfiler
        return StepProfiler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
