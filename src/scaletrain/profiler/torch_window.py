"""--torch-profile START:END: wrap a window of steps in torch.profiler, one Chrome trace per rank."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


class TorchProfileWindow:
    """Starts torch.profiler before step `start` and saves `torch-profile/rank{r}.json` after step end-1."""

    def __init__(self, start: int, end: int, out: Path, rank: int, device: torch.device) -> None:
        self.start, self.end = start, end
        self.path = Path(out) / "torch-profile" / f"rank{rank}.json"
        self.activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self._prof: profile | None = None

    @property
    def active(self) -> bool:
        return self._prof is not None

    def step_begins(self, step: int) -> None:
        if step == self.start and self._prof is None:
            self._prof = profile(activities=self.activities, record_shapes=True, with_stack=False)
            self._prof.__enter__()

    def step_ended(self, step: int) -> None:
        if self._prof is not None and step >= self.end - 1:
            self.close()

    def close(self) -> None:
        """Stop (also when the run ends inside the window) and save the trace."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.path))
