"""How busy the GPU was in a torch.profiler window (`train --torch-profile START:END` writes
torch-profile/rank{r}.json): the time its kernels ran (their union over streams) against the window's wall time.

A step's phases are timed by CUDA events on the training stream (profiler/clock.py), so a phase in which the
GPU waits for the host to launch its next kernel looks like GPU work. The busy fraction tells the two apart:
near 1 the device's arithmetic and memory set the step (what the data-sheet roofline prices); well below 1 the
host's launches do (a launch-bound step: small batches, many small kernels, host work between them, a sync per
step). Pure: a trace's dict in, numbers out."""

from __future__ import annotations

from typing import Any

LAUNCH = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def union_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def device_busy(trace: dict[str, Any], steps: int, top: int = 8) -> dict[str, Any] | None:
    """The window's GPU busy time and fraction, its kernels and launches per step, and the kernels that took most
    time (names cut to 80 characters); None for a trace without GPU kernels (a CPU run)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if not kernels or steps < 1:
        return None
    start = min(float(e["ts"]) for e in events)
    end = max(float(e["ts"]) + float(e.get("dur", 0)) for e in events)
    busy = union_us([(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in kernels])
    launches = [e for e in events if e.get("cat") == "cuda_runtime" and e.get("name") in LAUNCH]
    by_name: dict[str, float] = {}
    for e in kernels:
        name = str(e.get("name", ""))[:80]
        by_name[name] = by_name.get(name, 0.0) + float(e.get("dur", 0))
    window = max(end - start, 1e-9)
    return {"steps": steps, "window_s": window / 1e6, "busy_s": busy / 1e6, "busy_fraction": busy / window,
            "kernels_per_step": len(kernels) / steps, "launches_per_step": len(launches) / steps,
            "launch_s_per_step": sum(float(e.get("dur", 0)) for e in launches) / steps / 1e6,
            "top_kernels": [{"name": n, "s_per_step": t / steps / 1e6}
                            for n, t in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]]}
