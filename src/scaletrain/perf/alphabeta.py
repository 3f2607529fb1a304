"""Bandwidths as nccl-tests defines them and the alpha-beta model fitted to measurements (commbench's).

For an all-reduce of S bytes over P ranks taking t seconds:
    algorithm bandwidth  algbw = S / t
    bus bandwidth        busbw = algbw x 2 (P-1)/P     (comparable to the link rate whatever P is)
    alpha-beta model     t = 2 (P-1) alpha + 2 (P-1)/P x S x beta      (ring: 2 (P-1) steps of S/P bytes)
alpha is the latency per step, 1/beta the bandwidth per link. Pure functions; numpy fits. The bytes each
rank sends are perf/wire.py's.

`ps` (one parameter server among the P ranks, P-1 workers push S bytes and pull S bytes back) has the
same definitions with its own factors: 2 steps, and the server's link carries 2 (P-1) x S bytes, so
    busbw = algbw x 2 (P-1)        t = 2 alpha + 2 (P-1) x S x beta

`halo` (neighbours swap S bytes each way, computing between swaps: commbench/measure.py) is one step:
    busbw = algbw                  t = alpha + S x beta
"""

from __future__ import annotations

from typing import Any

import numpy as np


def bus_factor(world: int, strategy: str = "allreduce") -> float:
    """Bytes through the busiest link per byte reduced: 2 (P-1)/P for all-reduce, 2 (P-1) for a server, 1 for a
    halo swap (S bytes each way with a neighbour)."""
    return {"ps": 2 * (world - 1), "halo": 1}.get(strategy, 2 * (world - 1) / world)


def latency_steps(world: int, strategy: str = "allreduce") -> int:
    return {"ps": 2, "halo": 1}.get(strategy, 2 * (world - 1))


def bandwidths(size: int, seconds: float, world: int, strategy: str = "allreduce") -> tuple[float, float]:
    algbw = size / seconds
    return algbw, algbw * bus_factor(world, strategy)


def fit_alpha_beta(rows: list[dict[str, Any]], column: str = "time_s") -> tuple[float, float]:
    """Least squares of t = steps alpha + factor S beta over rows {strategy, world, size, time_s} (the
    steps and factor of each row's strategy, above); both >= 0. `column`: the seconds fitted (commbench's
    `cpu_s`, the CPU a collective takes, fits the same form)."""
    a = np.array([[latency_steps(r["world"], r.get("strategy", "allreduce")),
                   bus_factor(r["world"], r.get("strategy", "allreduce")) * r["size"]] for r in rows], dtype=float)
    t = np.maximum(np.array([r[column] for r in rows], dtype=float), 1e-9)
    # relative error matters at every size: weight each row by 1/t so 1 KB counts as much as 64 MB
    w = 1.0 / t
    (alpha, beta), *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    if alpha < 0 or beta < 0:  # refit the one that makes sense alone
        if beta <= 0:
            return float(np.mean(t / a[:, 0])), 0.0
        return 0.0, float(np.sum(w * w * a[:, 1] * t) / np.sum(w * w * a[:, 1] ** 2))
    return float(alpha), float(beta)


def predict(alpha: float, beta: float, world: int, size: int, strategy: str = "allreduce") -> float:
    return latency_steps(world, strategy) * alpha + bus_factor(world, strategy) * size * beta


def with_model(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """Each row gains algbw, busbw, predicted time and error; alpha and beta fitted per strategy."""
    fits = {}
    for strategy in sorted({r["strategy"] for r in rows}):
        mine = [r for r in rows if r["strategy"] == strategy]
        alpha, beta = fit_alpha_beta(mine)
        fits[strategy] = {"alpha_s": alpha, "beta_s_per_byte": beta,
                          "link_bytes_per_s": 1 / beta if beta > 0 else None}
        if all(r.get("cpu_s") is not None for r in mine):  # on CPU: what the collective takes of the host's cores
            cpu_alpha, cpu_beta = fit_alpha_beta(mine, "cpu_s")
            fits[strategy].update(cpu_alpha_s=cpu_alpha, cpu_beta_s_per_byte=cpu_beta)
    out = []
    for r in rows:
        algbw, busbw = bandwidths(r["size"], r["time_s"], r["world"], r["strategy"])
        f = fits[r["strategy"]]
        pred = predict(f["alpha_s"], f["beta_s_per_byte"], r["world"], r["size"], r["strategy"])
        out.append({**r, "algbw": algbw, "busbw": busbw, "predicted_s": pred,
                    "error": (pred - r["time_s"]) / r["time_s"]})
    return out, fits
