"""Fit the data-sheet roofline's efficiencies (fp32 units, TF32 and 16-bit tensor cores, memory) to the published
single-GPU training throughputs (src/scaletrain/perf/published/), then print every published row beside
its prediction through `predict` itself: per-GPU images/s and, for multi-GPU rows, the scaling efficiency.

    .venv/bin/python benchmarks/fit_datasheet.py            # the fit, and the table at the fitted values
    .venv/bin/python benchmarks/fit_datasheet.py --check    # the table at the shipped values only

The fit minimises the squared log error of images/s over the single-GPU rows (Nelder-Mead on the logs,
held in (0, 1]); the fitted values go into perf/hardware.Efficiency's defaults by hand, with the date and
this script's output in docs/predict-validation.md (docs/predict.md says how right it is)."""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

from scaletrain.perf.hardware import Efficiency, load_hardware
from scaletrain.predict.devset import EFFICIENCY_POINTS, TARGET, predict_row, rows, with_efficiency


FRACTIONS = ("compute", "tf32", "tensor", "memory")


def per_gpu(row, e: dict[str, float]) -> float:
    hw = with_efficiency(load_hardware(row.profile), **e)
    return predict_row(row, hw)["samples_per_s"] / row.gpus


def fit(single) -> dict[str, float]:
    from scipy.optimize import minimize

    def fractions(v) -> dict[str, float]:
        return {k: min(1.0, math.exp(x)) for k, x in zip(FRACTIONS, v)}

    def loss(v):
        e = fractions(v)
        return sum(math.log(per_gpu(r, e) / (r.images_per_s / r.gpus)) ** 2 for r in single)

    d = Efficiency()
    best = minimize(loss, [math.log(getattr(d, k)) for k in FRACTIONS], method="Nelder-Mead",
                    options={"xatol": 1e-3, "fatol": 1e-7, "maxiter": 400})
    return fractions(best.x)


def table(all_rows, e: dict[str, float]) -> list[float]:
    errors = []
    single = {(r.profile, r.precision, r.batch_per_gpu): r for r in all_rows if r.gpus == 1}
    print(f"{'system':34} {'prec':5} {'gpus':>4} {'batch':>5} {'published/GPU':>13} {'predicted/GPU':>13} "
          f"{'error':>7} {'scaling pub':>11} {'scaling pred':>12}")
    for r in all_rows:
        pred = per_gpu(r, e)
        pub = r.images_per_s / r.gpus
        err = pred / pub - 1
        errors.append(err)
        base = single.get((r.profile, r.precision, r.batch_per_gpu))
        scale_pub = scale_pred = ""
        if r.gpus > 1 and base is not None:
            scale_pub = f"{pub / base.images_per_s:.1%}"
            scale_pred = f"{pred / per_gpu(base, e):.1%}"
        flag = "" if abs(err) <= TARGET else "  <- outside the target"
        print(f"{r.system[:34]:34} {r.published_precision:5} {r.gpus:>4} {r.batch_per_gpu:>5} {pub:>13,.0f} "
              f"{pred:>13,.0f} {err:>+7.1%} {scale_pub:>11} {scale_pred:>12}{flag}")
    abs_err = sorted(abs(e) for e in errors)
    print(f"rows {len(errors)}: median |error| {statistics.median(abs_err):.1%}, worst {abs_err[-1]:.1%}, "
          f"{sum(e > 0 for e in errors)} over and {sum(e < 0 for e in errors)} under; target {TARGET:.0%} per row, "
          f"scaling within {EFFICIENCY_POINTS * 100:.0f} points")
    return errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only the table, at the shipped efficiencies")
    args = ap.parse_args(argv)
    all_rows = rows()
    shipped = {k: getattr(Efficiency(), k) for k in FRACTIONS}
    if args.check:
        print("at the shipped efficiencies: " + ", ".join(f"{k} = {v}" for k, v in shipped.items()))
        table(all_rows, shipped)
        return 0
    single = [r for r in all_rows if r.gpus == 1]
    t0 = time.perf_counter()
    print(f"fitting {', '.join(FRACTIONS)} efficiency to {len(single)} single-GPU rows ...", flush=True)
    e = fit(single)
    print(f"fitted in {time.perf_counter() - t0:.0f} s: " + ", ".join(f"{k} = {v:.3f}" for k, v in e.items())
          + " (shipped: " + ", ".join(f"{k} = {v}" for k, v in shipped.items()) + ")")
    table(all_rows, e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
