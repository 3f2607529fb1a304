"""`--bucket-cap-mb auto`: the DDP bucket size that hides the most gradient communication behind backward,
from the performance model (docs/predict.md#the-model), for the launch at hand.

The network is the one this launch really has: every rank times all-reduces of two sizes on its own
process group (a fraction of a second) and the alpha-beta fit of those is what the buckets are priced
with; backward's gradient timeline comes from this machine's calibration (the cached one). Rank 0
decides and every rank uses its decision, so buckets agree across ranks.
"""

from __future__ import annotations

from typing import Any

from scaletrain.predict.model import BUCKET_CAPS_MB

PROBE_BYTES = (1 << 16, 1 << 22)  # 64 KiB and 4 MiB: latency and bandwidth


def choose(cfg, alpha: float, beta: float) -> tuple[float | None, dict[str, Any]]:
    """(cap in MiB or None for DDP's default, what the choice rests on) for a TrainConfig; without a
    calibration of this machine, DDP's default with the reason."""
    from scaletrain.predict import calibration
    from scaletrain.predict.points import Predictor, predict_config

    if cfg.strategy.compression and cfg.strategy.compression[0] == "powersgd":
        return None, {"chosen_mb": None, "reason": "the performance model cannot price PowerSGD's buckets (their "
                                                    "bytes depend on each gradient's shape): DDP's default kept"}
    path = calibration.cache_path()
    if not path.is_file():
        return None, {"chosen_mb": None, "reason": f"no calibration of this machine ({path}): DDP's default kept; "
                                                    "run `scaletrain calibrate` once"}
    cal = calibration.load(path)
    # the launch's own latency and bandwidth; the CPU a collective takes (what hiding it costs backward): calibrated
    fits = (cal.get("network") or {}).get("fits") or {}
    network = {"intra": {k: {**{c: v for c, v in (fits.get(k) or {}).items() if c.startswith("cpu_")},
                             "alpha_s": alpha, "beta_s_per_byte": beta} for k in ("allreduce", "ring")},
               "inter": None, "source": "measured on this launch's process group"}
    flat = cfg.replace(bucket_cap_mb=None, nnodes=1, nproc=cfg.layout.world)
    comm = predict_config(Predictor(cal, network), flat)["comm"]  # at DDP's default, with the best cap beside it
    return comm.get("best_bucket_cap_mb"), {
        "chosen_mb": comm.get("best_bucket_cap_mb"), "candidates_mb": [c for c in BUCKET_CAPS_MB],
        "predicted_overlap_ratio": comm.get("best_overlap_ratio"), "default_overlap_ratio": comm.get("overlap_ratio"),
        "predicted_comm_exposed_s": comm.get("best_comm_exposed_s"), "alpha_s": alpha, "beta_s_per_byte": beta,
        "calibration": str(path)}


def describe(info: dict[str, Any]) -> str:
    if info.get("reason"):
        return f"--bucket-cap-mb auto: {info['reason']}"
    cap = info["chosen_mb"]
    chosen = "DDP's default (1 MiB first, then 25 MiB)" if cap is None else f"{cap:g} MiB"
    ratio = info.get("predicted_overlap_ratio")
    base = info.get("default_overlap_ratio")
    said = "" if ratio is None else f": predicted overlap {ratio:.0%}" + ("" if base is None else
                                                                         f" (DDP's default: {base:.0%})")
    return f"--bucket-cap-mb auto: {chosen}{said}"
