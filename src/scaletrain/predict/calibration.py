"""The calibration file: what `scaletrain calibrate` measured on one machine, read back by `predict`
(format in docs/predict.md). Plain JSON, versioned; no torch, so a file made on a cluster's GPU node
can be read anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scaletrain.errors import UserError
from scaletrain.rundir import replace_atomic

FORMAT = 1
KIND = "scaletrain-calibration"
REQUIRED = ("format", "kind", "device", "threads", "precisions", "layers", "optimizer", "loop", "loader", "network",
            "memory")


def cache_path() -> Path:
    """Where `predict` keeps this machine's calibration when none is given (`$XDG_CACHE_HOME/scaletrain`)."""
    from scaletrain.distributed.env import cache_dir

    return cache_dir() / "calibration.json"


def save(calibration: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomic(path, lambda f: json.dump(calibration, f, indent=1), mode="w")
    return path


def load(path: str | Path) -> dict[str, Any]:
    """The calibration in `path`; a missing, unreadable or foreign file is one UserError line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"calibration file {path} does not exist: make one with `scaletrain calibrate --out {path}`")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not a calibration file (not JSON: {e}): make one with scaletrain calibrate") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise UserError(f"{path} is not a scaletrain calibration file: make one with `scaletrain calibrate`")
    if data.get("format") != FORMAT:
        raise UserError(f"{path} is calibration format {data.get('format')}, this scaletrain reads format {FORMAT}: "
                        f"calibrate again with `scaletrain calibrate --out {path}`")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}: it was cut short; calibrate again")
    return data


# How much less right a quick calibration is, measured (docs/predict-validation.md, 2026-11-25): 8 held-out
# configurations (lenet5, resnet20 x 1-2 ranks x batch 32/64, 3 interleaved repeats each) predicted from a
# quick and from a full calibration of the same machine. `predict` says it before making a quick one.
QUICK_AGAINST_FULL = ("measured here against 8 held-out runs, a quick calibration predicted step times with a "
                      "median error of 29% (worst tenth 55%), a full one 9% (17%)")


def quick_notice(path: Path) -> str:
    """What `predict` prints before it calibrates this machine quickly (it has no calibration)."""
    return (f"no calibration of this machine yet: measuring a quick one now (a few minutes; {path}). "
            f"{QUICK_AGAINST_FULL[0].upper()}{QUICK_AGAINST_FULL[1:]}: run `scaletrain calibrate` once for a full "
            "one (about 10 minutes on 2 cores), which every later prediction reads")


UNSTEADY = 0.15  # a calibration whose probes moved more than this is flagged (docs/predict.md, Speed probe)


def unsteady(calibration: dict[str, Any], threads: int | None = None) -> str | None:
    """One line when the machine's speed moved more than UNSTEADY while it was calibrated, else None; with `threads`,
    at the calibrated thread count nearest it only (the probes at two threads can move 16% while one thread's move
    4%: the second core shared, the first not)."""
    spread = (calibration.get("probe") or {}).get("spread") or {}
    if threads is not None and spread:
        spread = {t: s for t, s in spread.items() if t == str(nearest_threads(calibration, threads))}
    worst = max(spread.values(), default=0.0)
    if worst <= UNSTEADY:
        return None
    return (f"the machine's speed moved {worst:.0%} while it was calibrated (speed probes along the op grid): "
            "predictions from this calibration can be off by as much; calibrate again when the machine is quieter")


def nearest_threads(calibration: dict[str, Any], threads: int) -> int:
    """The calibrated thread count closest to `threads` (ratio-wise)."""
    import math

    return min(calibration["threads"], key=lambda t: (abs(math.log(t / max(threads, 1))), -t))
