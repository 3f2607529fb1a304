"""Per-op time laws fitted to the calibration's measurements (scikit-learn), with their cross-validated
error; a shape that was measured is looked up, any other is predicted (docs/predict.md).

For each (op kind, precision, threads) and each of forward and backward, the law is a ridge regression
of log(seconds) on a degree-2 polynomial of the logs of the kind's features (ops.FEATURES) and of its
FLOPs or elements: smooth in every feature, multiplicative (a conv twice as wide costs about twice as
much), and well posed for the hundred-odd shapes a calibration measures. Its error is the median of
|predicted/measured - 1| over 5-fold cross-validation: what a shape the calibration never saw costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from scaletrain.predict.ops import FEATURES


def feature_vector(kind: str, f: dict[str, int]) -> list[float]:
    """log(1 + value) of the kind's features, and log of its arithmetic size (FLOPs or elements)."""
    values = [math.log1p(f[name]) for name in FEATURES[kind]]
    return values + [math.log1p(work(kind, f))]


def work(kind: str, f: dict[str, int]) -> float:
    """The op's arithmetic size: multiply-adds for conv and linear, elements touched for the others."""
    if kind == "conv":
        ho, wo = -(-f["h"] // f["stride"]), -(-f["w"] // f["stride"])
        return f["n"] * f["cout"] * ho * wo * f["cin"] / f["groups"] * f["k"] ** 2
    if kind == "linear":
        return f["n"] * f["fin"] * f["fout"]
    if kind == "norm":
        return f["n"] * f["c"] * f["hw"]
    if kind == "pool":
        return f["n"] * f["c"] * f["h"] * f["w"]
    return f["elements"] * f["inputs"]


@dataclass
class Law:
    """One fitted time law: log-seconds from features."""

    model: Any
    cv_error: float | None  # median |relative error| in cross-validation
    points: int

    def seconds(self, kind: str, f: dict[str, int]) -> float:
        return float(math.exp(self.model.predict(np.array([feature_vector(kind, f)]))[0]))


def fit(kind: str, rows: list[dict[str, Any]], key: str, folds: int = 5) -> Law | None:
    """The law of `key` ("forward_s" or "backward_s") over calibration rows of one kind; None without data."""
    from sklearn.model_selection import KFold, cross_val_predict

    usable = [r for r in rows if r.get(key, 0) > 0]
    if len(usable) < 4:
        return None
    x = np.array([feature_vector(kind, r["features"]) for r in usable])
    y = np.log(np.array([r[key] for r in usable]))
    model = _pipeline(len(usable))
    cv = None
    if len(usable) >= 2 * folds:
        pred = cross_val_predict(_pipeline(len(usable)), x, y, cv=KFold(folds, shuffle=True, random_state=0))
        cv = float(np.median(np.abs(np.exp(pred - y) - 1)))
    model.fit(x, y)
    return Law(model, cv, len(usable))


def _pipeline(n: int):
    from sklearn.linear_model import RidgeCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import PolynomialFeatures, StandardScaler

    degree = 2 if n >= 30 else 1  # a quadratic in 8 features has 45 terms: it needs the points
    return make_pipeline(StandardScaler(), PolynomialFeatures(degree), RidgeCV(alphas=np.logspace(-4, 2, 13)))


class LayerTimes:
    """Forward and backward seconds of any op, from one calibration at one precision and thread count."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.exact: dict[tuple, dict[str, Any]] = {}
        self.laws: dict[tuple[str, str], Law | None] = {}
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_kind.setdefault(r["kind"], []).append(r)
            self.exact[(r["kind"], _key(r["features"]))] = r
        for kind, mine in by_kind.items():
            for key in ("forward_s", "backward_s"):
                self.laws[(kind, key)] = fit(kind, mine, key)

    def times(self, kind: str, f: dict[str, int]) -> tuple[float, float, str]:
        """(forward s, backward s, "measured" | "regression" | "none")."""
        row = self.exact.get((kind, _key(f)))
        if row is not None:
            return row["forward_s"], row["backward_s"], "measured"
        fwd, bwd = self.laws.get((kind, "forward_s")), self.laws.get((kind, "backward_s"))
        if fwd is None:
            return 0.0, 0.0, "none"
        backward = bwd.seconds(kind, f) if bwd is not None else 0.0
        return fwd.seconds(kind, f), backward, "regression"

    def errors(self) -> dict[str, dict[str, Any]]:
        return {f"{kind}/{key.removesuffix('_s')}": {"cv_median_abs_error": law.cv_error, "points": law.points}
                for (kind, key), law in self.laws.items() if law is not None}


def _key(f: dict[str, int]) -> tuple:
    return tuple(sorted(f.items()))
