"""What each correction of the calibration basis is worth: recorded studies predicted from one calibration
with every correction (predictor.CORRECTIONS), then with each one left out in turn, each prediction
validated against the studies' runs (docs/predict.md, "What each correction is worth"). No training runs.
benchmarks/corrections.py prints it; tests/test_predict_corrections.py holds the corrections to it."""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any


COMPUTE = ("forward", "backward")
PHASES = {"loop_factors": COMPUTE, "group_factors": COMPUTE, "group_bound": COMPUTE, "rank_slowdown": COMPUTE,
          "rank_constant": COMPUTE, "buffer_broadcast": ("forward",),
          "probe_drift": COMPUTE, "core_stretch": COMPUTE, "harness_excess": COMPUTE, "op_overhead": COMPUTE,
          "optimizer_residual": ("optimizer",), "loop_overheads": ("h2d", "other", "data_wait"),
          "overhead_slope": ("optimizer", "other"),
          "comm_residual": ("comm_exposed",), "comm_slope": ("comm_exposed",),
          "skew_floor": ("comm_exposed",), "comm_range": ("comm_exposed",), "loader_handoff": ("data_wait",),
          "worker_sharing": ("data_wait", "forward"), "ddp_copies": ("backward", "comm_exposed"),
          "overlap_cpu": ("backward", "comm_exposed"), "shared_latency": ("comm_exposed",)}
"""The phases each correction prices: its own error is theirs (their sum against the measured sum)."""


def phase_error(points: list[dict[str, Any]], phases: tuple[str, ...]) -> float | None:
    """The median over the points of |predicted - measured| / measured for the sum of `phases`."""
    from scaletrain.validate.stats import quantile

    errors = []
    for p in points:
        measured = sum((p["measured"].get("phases_s") or {}).get(k, 0.0) for k in phases)
        diff = sum(p["errors"]["phases"][k]["difference_s"] for k in phases if k in p["errors"]["phases"])
        if measured > 0 and any(k in p["errors"]["phases"] for k in phases):
            errors.append(abs(diff) / measured)
    return quantile(errors, 0.5) if errors else None


def ablation(calibration: str | Path, studies: list[str | Path]) -> list[dict[str, Any]]:
    """One row per configuration ("all", then each correction off): per study and over all of them, the
    validation's step-time and ratio summaries, and the predicted step times (to tell "no effect")."""
    from scaletrain.predict import calibration as C
    from scaletrain.predict.cli import predict_spec
    from scaletrain.predict.predictor import CORRECTIONS
    from scaletrain.predict.scaling import predict_grid
    from scaletrain.rundir import StudyDir
    from scaletrain.validate import ratios
    from scaletrain.validate.load import load_measured
    from scaletrain.validate.match import error_summary, validate

    cal = C.load(Path(calibration))
    network = {"intra": dict(cal["network"]["fits"]), "inter": None, "source": "calibration"}
    measured = {str(s): load_measured([Path(s)]) for s in studies}
    specs = {str(s): predict_spec(str(StudyDir(s).spec), {}, {}) for s in studies}
    rows = []
    for off in [None, *CORRECTIONS]:
        without = frozenset([off] if off else [])
        per, points, ratio_rows = {}, [], []
        for s in map(str, studies):
            with redirect_stdout(io.StringIO()):
                prediction = predict_grid(specs[s], cal, network, None, f"calibration {calibration}",
                                          without=without)
            v = validate(prediction, measured[s])
            per[s] = {"step": v["summary"], "ratios": v["ratio_summary"],
                      "ids": [p["id"] for p in v["points"]],
                      "predicted_s": [p["predicted"]["step_time_s"] for p in v["points"]], "points": v["points"]}
            points += v["points"]
            ratio_rows += v["ratios"]
        timed = [p["errors"]["step_time"] for p in points if p["errors"]["step_time"] is not None]
        rows.append({"without": off, "studies": per, "step": error_summary(timed),
                     "ratios": ratios.summary(ratio_rows), "points": points})
    for r in rows[1:]:  # the phases the correction prices, with it and without it: over all, and per study
        phases = PHASES[r["without"]]
        r["phases"] = list(phases)
        r["phase_error"] = phase_error(r["points"], phases)
        r["phase_error_with"] = phase_error(rows[0]["points"], phases)
        for s, v in r["studies"].items():
            v["phase_error"] = phase_error(v["points"], phases)
            v["phase_error_with"] = phase_error(rows[0]["studies"][s]["points"], phases)
    for r in rows:
        del r["points"]
        for v in r["studies"].values():
            v.pop("points", None)
    return rows
