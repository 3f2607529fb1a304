"""Price the runs benchmarks/gpu_measure.py made on a GPU with `predict --hardware` (on any machine: nothing
of this one enters) and print predicted against measured: samples/s, each phase, and the peak memory.

    .venv/bin/python benchmarks/gpu_compare.py tests/data/gpu-h200-2026-11-27/*.json --hardware dgx-h200

Runs of one configuration (several files, or rounds) are averaged; their spread is printed beside the error,
so that a model error can be told from the machine's; `busy` is how busy the GPU was in the traced steps
(gpu_measure --trace): well below 100%, the host's launches set the step."""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from scaletrain.perf.hardware import load_hardware
from scaletrain.predict.devset import predict_flags

PHASES = ("h2d", "forward", "backward", "optimizer", "other")


def runs(paths: list[Path]) -> dict[str, list[dict]]:
    """Configuration name -> its measured rows (failed runs left out), in file order."""
    out: dict[str, list[dict]] = defaultdict(list)
    for path in paths:
        for row in json.loads(path.read_text())["rows"]:
            if "error" not in row and row.get("samples_per_s"):
                out[row["name"]].append(row)
    return out


def compare(name: str, rows: list[dict], hw, image_size: int) -> dict:
    """One configuration: its runs' mean and spread, and the prediction of the same flags."""
    point = predict_flags(hw, rows[0]["flags"], image_size)
    rates = [r["samples_per_s"] for r in rows]
    mean = statistics.fmean(rates)
    phases = {p: statistics.fmean(r["phases_mean_s"][p] for r in rows) for p in PHASES}
    peak = statistics.fmean(r["peak_memory_bytes"] for r in rows)
    busy = [r["device_busy"]["busy_fraction"] for r in rows if r.get("device_busy")]  # gpu_measure --trace
    return {"name": name, "runs": len(rows), "measured": mean, "spread": (max(rates) - min(rates)) / mean,
            "predicted": point["samples_per_s"], "error": point["samples_per_s"] / mean - 1,
            "phases": phases, "predicted_phases": {p: point["phases_s"][p] for p in PHASES},
            "peak": peak, "predicted_peak": point["peak_memory_bytes"],
            "memory_error": point["peak_memory_bytes"] / peak - 1, "busy": statistics.fmean(busy) if busy else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="gpu-runs.json files of benchmarks/gpu_measure.py")
    p.add_argument("--hardware", default="dgx-h200", help="the profile of the GPU the runs were made on")
    p.add_argument("--image-size", type=int, default=224)
    a = p.parse_args()
    hw = load_hardware(a.hardware)
    print(f"{'configuration':20} {'runs':>4} {'measured/s':>10} {'spread':>6} {'predicted':>9} {'error':>7} "
          + " ".join(f"{ph:>15}" for ph in PHASES) + f" {'peak GiB':>8} {'pred':>6} {'error':>6} {'busy':>5}")
    errors = []
    for name, rows in runs(a.runs).items():
        c = compare(name, rows, hw, a.image_size)
        errors.append(c["error"])
        cells = " ".join(f"{1e3 * c['phases'][ph]:6.2f}/{1e3 * c['predicted_phases'][ph]:6.2f}ms" for ph in PHASES)
        print(f"{name:20} {c['runs']:>4} {c['measured']:>10,.0f} {c['spread']:>6.1%} {c['predicted']:>9,.0f} "
              f"{c['error']:>+7.1%} {cells} {c['peak'] / 2**30:>8.2f} {c['predicted_peak'] / 2**30:>6.2f} "
              f"{c['memory_error']:>+6.1%} {'' if c['busy'] is None else format(c['busy'], '.0%'):>5}")
    absolute = sorted(abs(e) for e in errors)
    print(f"samples/s: median |error| {statistics.median(absolute):.1%}, worst {absolute[-1]:.1%}, "
          f"{sum(e > 0 for e in errors)} too fast, {sum(e < 0 for e in errors)} too slow "
          "(phases: measured/predicted)")


if __name__ == "__main__":
    main()
