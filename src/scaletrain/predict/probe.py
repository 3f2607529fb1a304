"""The machine's speed now against its speed when it was calibrated (docs/predict.md, "Speed probe").

A shared machine (a VM, a node whose neighbours are busy) does not keep one speed: on our 2-core VM the
same network's step ran 20-30% faster on one day than on another. A calibration freezes one of those
speeds. The probe is one short, fixed piece of work — forward, loss and backward of the reference
network (predict/refnet.py) at batch 32, 32x32 pixels, fp32, in this process — timed at each calibrated
thread count: `calibrate` times it along its op grid and around its loop runs (the loop factor is
corrected by it); `predict --probe auto|on` times it again (about a second) on the host it was calibrated
on and scales the calibrated compute by the ratio, written to prediction.json (`speed_probe`). Off by
default: a half-second reading in a process that has just started proved too unsteady here to help.
"""

from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scaletrain.perf.timing import samples

BATCH, SIZE = 32, 32


def probe_s(threads: int, device: torch.device | None = None, seconds: float = 0.5) -> float:
    """Median seconds of one forward + loss + backward of the reference network at `threads` threads."""
    from scaletrain.predict import refnet

    device = device or torch.device("cpu")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = refnet.build(10, 3, SIZE).to(device).train()
        x = torch.randn(BATCH, 3, SIZE, SIZE, generator=gen).to(device)
        y = torch.randint(0, 10, (BATCH,), generator=gen).to(device)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

        def step() -> float:
            t0 = time.perf_counter()
            nn.functional.cross_entropy(model(x), y).backward()
            sync()
            for p in model.parameters():
                p.grad = None
            return time.perf_counter() - t0

        return statistics.median(samples(step, warmup=3, least=5, seconds=seconds, most=200))
    finally:
        torch.set_num_threads(before)


def measure(threads: list[int], device: torch.device | None = None, seconds: float = 0.5) -> dict[str, float]:
    """{threads (as a JSON key): probe seconds} for each thread count."""
    return {str(t): probe_s(t, device, seconds) for t in threads}


def this_host(cal: dict[str, Any]) -> bool:
    """Whether `cal` was measured on this machine (same host name and device), so a probe here compares."""
    d = cal.get("device", {})
    device = torch.device("cuda" if d.get("type") == "cuda" and torch.cuda.is_available() else "cpu")
    return d.get("host") == platform.node() and d.get("type") == device.type and d.get("name") == device_name(device)


def speed_now(cal: dict[str, Any], mode: str = "auto") -> dict[str, Any] | None:
    """The probe now against the calibration's: {"threads": {t: {calibrated_s, now_s, ratio}}, "applied"}.

    mode `off`: None. `auto`: probe only a calibration of this host that has a probe. `on`: the same, but
    a calibration without a probe or from another host is an error rather than a skip."""
    from scaletrain.errors import UserError

    if mode == "off":
        return None
    calibrated = (cal.get("probe") or {}).get("mean_s") or {}
    why = ("the calibration has no speed probe (made by an older scaletrain): calibrate again" if not calibrated else
           None if this_host(cal) else "the calibration was made on another machine: a probe here compares nothing")
    if why:
        if mode == "on":
            raise UserError(f"--probe on: {why}, or predict with --probe off")
        return {"applied": False, "why": why, "threads": {}}
    device = torch.device(cal["device"]["type"] if cal["device"]["type"] != "cuda" or torch.cuda.is_available()
                          else "cpu")
    now = measure([int(t) for t in calibrated], device)
    rows = {t: {"calibrated_s": calibrated[t], "now_s": now[t], "ratio": now[t] / calibrated[t]} for t in calibrated}
    return {"applied": True, "why": None, "threads": rows}


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"
