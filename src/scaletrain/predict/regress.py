"""Per-op time laws fitted to the calibration's measurements (scikit-learn), with their cross-validated
error; a shape that was measured is looked up, any other is predicted (docs/predict.md).

For each (op kind, precision, threads) and each of forward and backward, the law is the op's rate:
log(seconds / work) (work = multiply-adds or elements) as gradient-boosted trees over the logs of the
kind's features (kinds.FEATURES) and of its work, times the work. Trees follow the steps a device's rate
takes with the shape (vector widths, cache sizes) that a polynomial smooths over; outside the calibrated
range the rate is held at its edge, so time grows with work. Its error is the median of
|predicted/measured - 1| over 5-fold cross-validation: what a shape the calibration never saw costs.
(Compared here on one calibration: ridge on a degree-2 polynomial of the logs cross-validated at 18-23%
for conv, these trees at 15-19%.)
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from scaletrain.predict.kinds import FEATURES


def feature_vector(kind: str, f: dict[str, int]) -> list[float]:
    """log(1 + value) of the kind's features, and log of its arithmetic size (FLOPs or elements)."""
    values = [math.log1p(f[name]) for name in FEATURES[kind]]
    return values + [math.log1p(work(kind, f))]


def work(kind: str, f: dict[str, int]) -> float:
    """The op's arithmetic size: multiply-adds for conv and linear, elements touched for the others."""
    if kind == "conv":
        ho, wo = -(-f["h"] // f["stride"]), -(-f["w"] // f["stride"])
        return f["n"] * f["cout"] * ho * wo * f["cin"] * f["k"] ** 2
    if kind == "dwconv":
        ho, wo = -(-f["h"] // f["stride"]), -(-f["w"] // f["stride"])
        return f["n"] * f["c"] * ho * wo * f["k"] ** 2
    if kind == "linear":
        return f["n"] * f["fin"] * f["fout"]
    if kind == "norm":
        return f["n"] * f["c"] * f["hw"]
    if kind in ("pool", "avgpool"):
        return f["n"] * f["c"] * f["h"] * f["w"]
    return f["elements"] * f["inputs"]


@dataclass
class Law:
    """One fitted time law: the op's rate from its features, held to the calibrated range, times its work."""

    model: Any
    cv_error: float | None  # median |relative error| in cross-validation
    points: int
    low: np.ndarray | None = None
    high: np.ndarray | None = None

    def seconds(self, kind: str, f: dict[str, int]) -> float:
        x = np.array(feature_vector(kind, f))
        held = np.clip(x, self.low, self.high) if self.low is not None else x
        return float(math.exp(self.model.predict(held[None, :])[0]) * max(work(kind, f), 1.0))


def fit(kind: str, rows: list[dict[str, Any]], key: str, folds: int = 5,
        known: dict[str, Any] | None = None) -> Law | None:
    """The law of `key` ("forward_s" or "backward_s") over calibration rows of one kind; None without data.
    `known`: the law's cross-validation as `calibrate` stored it beside the rows (`fit_record`), which is
    then not run again: the trees are seeded, so the law fitted here is the one calibrate validated."""
    usable = [r for r in rows if r.get(key, 0) > 0]
    if len(usable) < 4:
        return None
    x, y, w = _data(kind, usable, key)
    if known is not None and known.get("points") == len(usable):
        cv = known.get("cv_median_abs_error")
    else:
        cv = _cross_validate(x, y, w, folds)
    model = _model(len(usable))
    model.fit(x, y - w)
    return Law(model, cv, len(usable), x.min(axis=0), x.max(axis=0))


def fit_record(kind: str, rows: list[dict[str, Any]], key: str, folds: int = 5) -> dict[str, Any] | None:
    """What `calibrate` stores of a law beside its rows: its cross-validated error and its points."""
    usable = [r for r in rows if r.get(key, 0) > 0]
    if len(usable) < 4:
        return None
    return {"cv_median_abs_error": _cross_validate(*_data(kind, usable, key), folds), "points": len(usable)}


def fit_records(layers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every law of a calibration's layer rows, by `law_key`: cross-validated once, in calibrate."""
    out = {}
    for (precision, threads, kind), rows in _groups(layers).items():
        for key in ("forward_s", "backward_s"):
            record = fit_record(kind, rows, key)
            if record is not None:
                out[law_key(precision, threads, kind, key)] = record
    return out


def law_key(precision: str, threads: int, kind: str, key: str) -> str:
    return f"{precision}/{threads}/{kind}/{key.removesuffix('_s')}"


def _groups(layers: list[dict[str, Any]]) -> dict[tuple[str, int, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in layers:
        groups.setdefault((r["precision"], r["threads"], r["kind"]), []).append(r)
    return groups


def _data(kind: str, usable: list[dict[str, Any]], key: str):
    x = np.array([feature_vector(kind, r["features"]) for r in usable])
    y = np.log(np.array([r[key] for r in usable]))
    w = np.log(np.array([max(work(kind, r["features"]), 1.0) for r in usable]))
    return x, y, w


def _cross_validate(x, y, w, folds: int) -> float | None:
    if len(y) < 2 * folds:
        return None
    from sklearn.model_selection import KFold, cross_val_predict

    pred = cross_val_predict(_model(len(y)), x, y - w, cv=KFold(folds, shuffle=True, random_state=0))
    return float(np.median(np.abs(np.exp(pred + w - y) - 1)))


def _model(n: int):
    """Gradient-boosted trees on log(seconds per unit of work): the device's rate as a function of the
    shape, which trees follow through the thresholds a polynomial smooths over (vector widths, caches)."""
    from sklearn.ensemble import GradientBoostingRegressor

    return GradientBoostingRegressor(n_estimators=150, max_depth=3, learning_rate=0.08, subsample=0.8,
                                     min_samples_leaf=2 if n < 60 else 3, random_state=0)


class LayerTimes:
    """Forward and backward seconds of any op, from one calibration at one precision and thread count."""

    def __init__(self, rows: list[dict[str, Any]], fits: dict[str, dict[str, Any]] | None = None) -> None:
        """`fits`: the calibration's stored cross-validations (`fit_records`); without them (a calibration
        made before 2026-11-26, or rows made in a test) each law is cross-validated here."""
        self.exact: dict[tuple, dict[str, Any]] = {}
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_kind.setdefault(r["kind"], []).append(r)
            self.exact[(r["kind"], _key(r["features"]))] = r
        digest = hashlib.sha1(json.dumps([rows, fits, _versions()], sort_keys=True, default=str).encode()).hexdigest()
        if digest not in _FITTED:  # the same rows again in this process (a sweep's points, a study): fitted once
            _FITTED[digest] = _kept_fits(digest, by_kind, fits)
            while len(_FITTED) > _FITTED_KEPT:
                del _FITTED[next(iter(_FITTED))]
        self.laws: dict[tuple[str, str], Law | None] = _FITTED[digest]
        self._priced: dict[tuple, tuple[float, float, str]] = {}  # the same op again (every point of a grid)

    def times(self, kind: str, f: dict[str, int]) -> tuple[float, float, str]:
        """(forward s, backward s, "measured" | "regression" | "none")."""
        key = (kind, _key(f))
        if key not in self._priced:
            self._priced[key] = self._times(kind, f, key)
        return self._priced[key]

    def _times(self, kind: str, f: dict[str, int], key: tuple) -> tuple[float, float, str]:
        row = self.exact.get(key)
        if row is None and f.get("inplace"):  # a calibration made before in-place ops were timed so (2026-11-27)
            row = self.exact.get((kind, _key({k: v for k, v in f.items() if k != "inplace"})))
        if row is not None:
            return row["forward_s"], row["backward_s"], "measured"
        fwd, bwd = self.laws.get((kind, "forward_s")), self.laws.get((kind, "backward_s"))
        if fwd is None:
            return 0.0, 0.0, "none"
        backward = bwd.seconds(kind, f) if bwd is not None else 0.0
        return fwd.seconds(kind, f), backward, "regression"

    def with_rows(self, rows: list[dict[str, Any]]) -> LayerTimes:
        """A copy whose measured shapes also hold `rows` (its laws unchanged: fitted on the calibration's grid)."""
        other = copy.copy(self)
        other.exact, other._priced = dict(self.exact), {}
        for r in rows:
            other.add(r)
        return other

    def add(self, row: dict[str, Any]) -> None:
        """One more measured shape (a layer row): looked up from now on."""
        key = (row["kind"], _key(row["features"]))
        self.exact[key] = row
        self._priced.pop(key, None)

    def has(self, kind: str) -> bool:
        """Whether the calibration timed ops of `kind` (a law or a measured row)."""
        return self.laws.get((kind, "forward_s")) is not None or any(k == kind for k, _ in self.exact)

    def errors(self) -> dict[str, dict[str, Any]]:
        return {f"{kind}/{key.removesuffix('_s')}": {"cv_median_abs_error": law.cv_error, "points": law.points}
                for (kind, key), law in self.laws.items() if law is not None}


_FITTED: dict[str, dict[tuple[str, str], Law | None]] = {}
_FITTED_KEPT = 32  # (precision, threads) groups of a few calibrations


def _versions() -> tuple[str, str]:
    import sklearn

    return sklearn.__version__, np.__version__


def _kept_fits(digest: str, by_kind: dict[str, list[dict[str, Any]]], fits: dict[str, dict[str, Any]] | None
               ) -> dict[tuple[str, str], Law | None]:
    """The laws of these rows, fitted once per machine: kept in the user's cache (beside the machine's calibration) under
    the digest of the rows, their stored cross-validations and the fitting libraries' versions, so that every
    `predict` and `plan` after the first reads them (seconds of tree fitting per precision and thread count).
    A kept file that cannot be read is fitted again and replaced."""
    import pickle

    from scaletrain.predict.calibration import cache_path
    from scaletrain.rundir import replace_atomic

    path = cache_path().parent / "laws" / f"{digest}.pkl"
    try:
        with open(path, "rb") as f:
            return pickle.load(f)  # written by this function alone, into the user's own cache
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        pass
    laws = _fit_all(by_kind, fits)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_atomic(path, lambda f: pickle.dump(laws, f), mode="wb")
    except OSError:  # a read-only cache: fitted again next time
        pass
    return laws


def _fit_all(by_kind: dict[str, list[dict[str, Any]]], fits: dict[str, dict[str, Any]] | None
             ) -> dict[tuple[str, str], Law | None]:
    laws: dict[tuple[str, str], Law | None] = {}
    for kind, mine in by_kind.items():
        for key in ("forward_s", "backward_s"):
            known = (fits or {}).get(law_key(mine[0]["precision"], mine[0]["threads"], kind, key)) \
                if "precision" in mine[0] else None
            laws[(kind, key)] = fit(kind, mine, key, known=known)
    return laws


def _key(f: dict[str, int]) -> tuple:
    return tuple(sorted(f.items()))
