"""The step profiler: per-rank phase timelines, gradient communication timing, torch.profiler windows."""

from scaletrain.profiler.step_profiler import StepProfiler
from scaletrain.profiler.timeline import PHASES

__all__ = ["StepProfiler", "PHASES"]
