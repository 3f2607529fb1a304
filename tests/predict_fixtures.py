"""A calibration made up from known laws (no timing), so the predictor's arithmetic can be checked exactly
and quickly: op seconds = 20 us + 1 ns x work forward, twice that backward."""

from __future__ import annotations

import copy
from typing import Any

from scaletrain.predict import grid
from scaletrain.predict.calibration import FORMAT, KIND
from scaletrain.predict.regress import law_key, work

FAKE_CV_ERROR = 0.05
"""The cross-validated error fake calibrations carry as `calibrate` stores it (`fits`): predictions from them
fit each law without cross-validating it (6 s per precision here); test_predict_model checks the real one."""


def law_forward(kind: str, f: dict[str, int]) -> float:
    return 2e-5 + 1e-9 * work(kind, f)


def fake_calibration(threads=(1, 2), precisions=("fp32",)) -> dict[str, Any]:
    layers = []
    for prec in precisions:
        for t in threads:
            for kind, n in grid.COUNTS.items():
                for f in grid.shapes(kind, n):
                    fwd = law_forward(kind, f) / t
                    layers.append({"kind": kind, "precision": prec, "threads": t, "features": f,
                                   "forward_s": fwd, "backward_s": 2 * fwd})
    fits = {law_key(prec, t, kind, key): {"cv_median_abs_error": FAKE_CV_ERROR, "points": len(grid.shapes(kind, n))}
            for prec in precisions for t in threads for kind, n in grid.COUNTS.items() for key in ("forward_s", "backward_s")}
    optimizer = [{"optimizer": o, "threads": t, "tensors": k, "numel": n, "seconds": 1e-5 + 1e-6 * k + 1e-9 * n}
                 for o in ("sgd", "nesterov", "adamw", "adagrad") for t in threads
                 for k, n in ((8, 4096), (32, 4096), (8, 1 << 18), (64, 1 << 14))]
    loader = [{"dataset": d, "image_size": s, "source_pixels": s * s, "channels": 3,
               "seconds_per_sample": 1e-5 + 1e-8 * s * s} for d in ("digits", "synthetic", "imagefolder")
              for s in (16, 32, 64)]
    loop_phases = {"data_wait": 0.001, "h2d": 1e-5, "forward": 0.02, "backward": 0.04, "comm_exposed": 0.0,
                   "optimizer": 0.001, "other": 0.0005}
    return {"format": FORMAT, "kind": KIND, "scaletrain_version": "test", "torch_version": "test",
            "created": "2026-01-01T00:00:00", "seconds": 0, "quick": True,
            "device": {"type": "cpu", "name": "test cpu", "cores": max(threads), "memory_bytes": None, "host": "t"},
            "threads": list(threads), "precisions": list(precisions), "layers": layers, "fits": fits, "optimizer": optimizer,
            "loader": {"rows": loader, "workers": [{"workers": 1, "batch_size": 32, "image_size": 64,
                                                    "source_pixels": 4096, "first_batch_s": 0.1, "per_batch_s": 0.02}],
                       "fit": {d: [1e-5, 1e-8, 0.0] for d in ("digits", "synthetic", "imagefolder")}},
            "network": {"fits": {k: {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9} for k in ("allreduce", "ring", "ps")}},
            "loop": {"runs": [{"nproc": 1, "threads": max(threads), "phases_mean_s": loop_phases,
                               "peak_memory_bytes": 500_000_000, "memory_kind": "rss"}],
                     "refnet": "scaletrain.predict.refnet:build", "batch_size": 32, "image_size": 32, "samples": 2048},
            "memory": {"baseline_rss_bytes": 500_000_000}}


NETWORK = {"intra": {k: {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9} for k in ("allreduce", "ring", "ps")},
           "inter": None}


def grads(cfg):
    """The values of each parameter tensor, as the prediction traced them."""
    from scaletrain.predict.points import data_facts, workload

    facts = data_facts(cfg.data.dataset, cfg.data.image_size, cfg.data.synthetic_samples, cfg.data.synthetic_classes,
                       cfg.data.augment)
    return [n for op in workload(cfg, facts, cfg.optim.batch_size).ops for n in op.param_numels]


def calibrated_here(cal, mean=(0.1, 0.05)):
    """`cal` as if made on this machine, with speed probes of `mean` seconds at 1 and 2 threads."""
    import platform

    import torch

    from scaletrain.predict.probe import device_name

    cal = copy.deepcopy(cal)
    cal["device"].update(host=platform.node(), name=device_name(torch.device("cpu")))
    cal["probe"] = {"mean_s": {"1": mean[0], "2": mean[1]}, "loop_mean_s": {"1": mean[0], "2": mean[1]}}
    return cal
