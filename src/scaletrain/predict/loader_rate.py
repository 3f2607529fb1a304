"""One core's input-pipeline rate, measured on a node of the cluster for a data-sheet prediction
(`scaletrain calibrate --only loader --dataset D --image-size S --out loader.json`, then `predict --hardware H
--loader loader.json`): the samples per second one process with one thread reads, decodes, augments and
collates, at the run's image size. The file (docs/predict.md, "The input pipeline on a data sheet"):

    {"format": 1, "kind": "loader-rate", "dataset": D, "image_size": S, "batch_size": 32,
     "samples_per_s_per_core": r, "host": ..., "created": ..., "scaletrain_version": ...}
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
from pathlib import Path
from typing import Any

from scaletrain.errors import UserError

FORMAT = 1
KIND = "loader-rate"
BATCH = 32


def measure(dataset: str, image_size: int | None, batches: int = 20) -> dict[str, Any]:
    """The rate of one core (torch and the decoder held to one thread) through `dataset`'s training split."""
    import torch

    import scaletrain
    from scaletrain.data.registry import build_datasets
    from scaletrain.predict.calibrate import seconds_per_sample

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = build_datasets(dataset, image_size=image_size)
        if len(data.train) < 2 * BATCH:
            raise UserError(f"--dataset {dataset} has {len(data.train)} training samples: the loader's rate needs "
                            f"at least {2 * BATCH}")
        seconds = seconds_per_sample(data.train, BATCH, min(batches, len(data.train) // BATCH - 1))
    finally:
        torch.set_num_threads(threads)
    return {"format": FORMAT, "kind": KIND, "dataset": dataset, "image_size": data.image_size, "batch_size": BATCH,
            "samples_per_s_per_core": 1.0 / seconds, "host": platform.node(),
            "created": datetime.datetime.now().isoformat(timespec="seconds"),
            "scaletrain_version": scaletrain.__version__}


def load(path: str | Path) -> dict[str, Any]:
    """A loader-rate file; anything else is one line naming what it is not."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        raise UserError(f"--loader {path}: not a readable JSON file: measure one with `scaletrain calibrate --only "
                        "loader --dataset D --image-size S --out FILE` on a node of the cluster") from None
    if not isinstance(data, dict) or data.get("kind") != KIND or data.get("format") != FORMAT:
        raise UserError(f"--loader {path} is not a loader-rate file (format {FORMAT}): measure one with "
                        "`scaletrain calibrate --only loader --dataset D --image-size S --out FILE`")
    rate = data.get("samples_per_s_per_core")
    if not isinstance(rate, (int, float)) or not rate > 0:
        raise UserError(f"--loader {path}: samples_per_s_per_core must be a positive number: measure it again")
    return data


def applied(hw, rate: dict[str, Any]):
    """The profile with its host's loader rate replaced by the measured one."""
    return dataclasses.replace(hw, loader_samples_per_s_per_core=float(rate["samples_per_s_per_core"]))
