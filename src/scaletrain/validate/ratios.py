"""Ratios measured side by side, and the machine's own spread: what separates the model's error from the
machine's (docs/validate.md, "Ratios and spread").

A shared machine drifts 5-10% between repeats made minutes apart: an absolute step time cannot show a 10%
error. A ratio of two points measured in the same study (interleaved repeats) cancels the drift: the speedup
from 1 to 2 ranks, from batch 32 to 64, fp32 to bf16, 0 to 2 loader workers, one link rate to another, one
strategy or bucket size to another. Each pair of validated points that differ in exactly one setting of
RATIO_AXES gives a ratio of throughputs (samples/s of the second over the first), measured and predicted,
and its error predicted / measured - 1; where the two points' repeats pair up by round (a study's r0 with r0),
the geometric mean of the rounds' ratios, with their spread as the ratio's own noise and the standard error of that
mean; over the ratios, the errors an exact model would show from that noise alone (`noise_floor`). Pure: dicts in,
dicts out."""

from __future__ import annotations

import math
import statistics
from typing import Any

from scaletrain.validate.stats import quantile, signs, spread  # noqa: F401 (spread, signs: re-exported)

RATIO_AXES = ("nproc", "nnodes", "batch_size", "precision", "workers", "strategy", "bucket_cap_mb", "compress",
              "link", "model")
"""Settings a ratio may vary, one at a time (link: the testbed's or --link rate, where the configs carry it)."""
SAME = ("model", "dataset", "batch_size", "nproc", "nnodes", "workers", "precision", "strategy", "compress",
        "ps_servers", "image_size", "bucket_cap_mb", "threads", "link")
"""The settings two points of a ratio must otherwise share."""


def _key(config: dict[str, Any], skip: str) -> tuple:
    return tuple((k, str(config.get(k))) for k in SAME if k != skip)


def ratios(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every ratio the validated points allow: within each group of points equal on every SAME setting but
    one axis, each point against the group's first in that axis's order (the speedup over ranks, ...)."""
    out = []
    for axis in RATIO_AXES:
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for p in points:
            if p["config"].get(axis) is None:
                continue
            groups.setdefault(_key(p["config"], axis), []).append(p)
        for group in groups.values():
            values = {str(p["config"][axis]) for p in group}
            if len(values) < 2:
                continue
            group = sorted(group, key=lambda p: _order(p["config"][axis]))
            base = group[0]
            for p in group[1:]:
                r = _ratio(axis, base, p)
                if r is not None:
                    out.append(r)
    return out


def _order(value: Any) -> tuple:
    return (0, float(value), "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0.0, str(value))


def _throughput(side: dict[str, Any]) -> float | None:
    rate = side.get("samples_per_s")
    return rate if rate and rate > 0 else None


def _ratio(axis: str, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    measured = [_throughput(a["measured"]), _throughput(b["measured"])]
    predicted = [_throughput(a["predicted"]), _throughput(b["predicted"])]
    if None in measured or None in predicted:
        return None
    m, p = measured[1] / measured[0], predicted[1] / predicted[0]
    spreads = [x for x in (a["measured"].get("spread"), b["measured"].get("spread")) if x is not None]
    noise = math.sqrt(sum(x * x for x in spreads)) if len(spreads) == 2 else None
    paired = paired_ratios(a["measured"], b["measured"])
    standard_error = None
    if len(paired) >= 2:  # repeats of the same round side by side: the ratio's own noise, drift cancelled
        m = statistics.geometric_mean(paired)
        noise = (max(paired) - min(paired)) / m
        standard_error = statistics.stdev(math.log(x) for x in paired) / math.sqrt(len(paired))
    return {"axis": axis, "from": a["id"], "to": b["id"], "from_value": a["config"].get(axis),
            "to_value": b["config"].get(axis), "measured": m, "predicted": p, "error": p / m - 1,
            "spread": noise, "pairs": len(paired), "standard_error": standard_error}


def paired_ratios(a: dict[str, Any], b: dict[str, Any]) -> list[float]:
    """The throughput ratio b / a of each round both points ran (a study's r0 with r0, r1 with r1: run
    minutes apart at most, interleaved), in the rounds' order; [] when the repeats cannot be paired."""
    ra, rb = a.get("samples_per_s_by_repeat") or {}, b.get("samples_per_s_by_repeat") or {}
    return [rb[k] / ra[k] for k in sorted(ra) if k in rb and ra[k] and rb[k]]


NOISE_Z = 2.0
"""A ratio errs beyond the rounds' noise when its log error exceeds this many of its standard errors (about 95%
of an exact model's would not)."""
NOISE_DRAWS = 4000  # simulated validations of an exact model (noise_floor)


def noise_floor(standard_errors: list[float]) -> dict[str, float | None]:
    """The median and p90 |error| that a model without error would show on these ratios, from their rounds' noise
    alone: each measured ratio off the truth by its standard error (log-normal), NOISE_DRAWS simulated validations,
    the mean of their median and p90 |error|. A target below it cannot be told met or missed with these rounds."""
    import numpy as np

    if not standard_errors:
        return {"noise_median_abs_error": None, "noise_p90_abs_error": None}
    draws = np.random.default_rng(0).normal(size=(NOISE_DRAWS, len(standard_errors))) * np.asarray(standard_errors)
    errors = np.abs(np.expm1(-draws))  # predicted (the truth) / measured - 1
    return {"noise_median_abs_error": float(np.quantile(errors, 0.5, axis=1).mean()),
            "noise_p90_abs_error": float(np.quantile(errors, 0.9, axis=1).mean())}


def summary(ratio_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the ratios: count, median and p90 of |error|, signs, how many err by more than their spread and by
    more than twice their standard error, the noise floor (`noise_floor`); and the same per axis."""
    def over(rows: list[dict[str, Any]]) -> dict[str, Any]:
        errors = [r["error"] for r in rows]
        if not errors:
            return {"count": 0}
        absolute = [abs(e) for e in errors]
        noisy = [r for r in rows if r["spread"] is not None]
        known = [r for r in rows if r.get("standard_error") is not None]
        return {"count": len(errors), "median_abs_error": quantile(absolute, 0.5),
                "p90_abs_error": quantile(absolute, 0.9), **signs(errors),
                "beyond_spread": sum(1 for r in noisy if abs(r["error"]) > r["spread"]),
                "with_spread": len(noisy), **noise_floor([r["standard_error"] for r in known]),
                "beyond_noise": sum(1 for r in known
                                    if abs(math.log1p(r["error"])) > NOISE_Z * r["standard_error"]),
                "with_noise": len(known)}

    axes = sorted({r["axis"] for r in ratio_rows}, key=RATIO_AXES.index)
    return {**over(ratio_rows), "by_axis": {a: over([r for r in ratio_rows if r["axis"] == a]) for a in axes}}


def reproducibility(validations: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """How well the machine reproduces its own ratios: `validations` maps a study's name to its validated `ratios`
    (the same grid measured in several studies, hours apart). Between every two studies, each ratio both measured:
    |one / the other - 1| (`between`: median, p90, count). Per study, the errors of a leave-one-out oracle, each ratio
    foretold by the geometric mean of the other studies' measurements (`oracle`), beside the model's own (`model`):
    where the model errs as little as the machine's other studies would, no model could do better from them."""
    def key(r: dict[str, Any]) -> tuple:
        return r["axis"], r["from"], r["to"]

    measured = {name: {key(r): r["measured"] for r in rows} for name, rows in validations.items()}
    names = list(measured)
    between = [abs(measured[a][k] / measured[b][k] - 1)
               for i, a in enumerate(names) for b in names[i + 1:] for k in measured[a] if k in measured[b]]

    def figures(errors: list[float]) -> dict[str, Any]:
        return ({"median": quantile(errors, 0.5), "p90": quantile(errors, 0.9), "count": len(errors)} if errors
                else {"median": None, "p90": None, "count": 0})

    studies = {}
    for name, rows in validations.items():
        oracle = []
        for k, m in measured[name].items():
            others = [measured[o][k] for o in names if o != name and k in measured[o]]
            if others:
                oracle.append(abs(statistics.geometric_mean(others) / m - 1))
        studies[name] = {"oracle": figures(oracle), "model": figures([abs(r["error"]) for r in rows])}
    return {"between": figures(between), "studies": studies}
