"""Published training throughputs: the development set of the data-sheet basis (docs/predict.md).

`perf/published/*.toml` hold rows copied from their sources (each file names its own): a system, the
shipped profile that describes it, the model, image size, precision as published and as scaletrain runs it,
GPUs, batch per GPU and images per second. `predict_row` prices one row through `predict` itself (the
data-sheet basis, synthetic data: the published runs feed the GPUs from DALI, which no CPU loader prices);
`benchmarks/fit_datasheet.py` fits the roofline's efficiencies to the single-GPU rows and prints every
row's error; tests/test_datasheet_published.py holds each row to its target."""

from __future__ import annotations

import dataclasses
import tomllib
from importlib import resources
from typing import Any

from scaletrain.perf.hardware import Efficiency, Hardware, load_hardware

TARGET = 0.25  # |predicted / published - 1| per row, the target for per-GPU throughput
EFFICIENCY_POINTS = 0.05  # multi-GPU scaling efficiency within 5 points of the published one


@dataclasses.dataclass(frozen=True)
class Row:
    system: str
    profile: str
    model: str
    image_size: int
    precision: str  # as scaletrain runs it: fp32 (TF32 convolutions where the device has them), fp16
    published_precision: str
    gpus: int
    batch_per_gpu: int
    images_per_s: float
    source: str


def rows() -> list[Row]:
    """Every published row shipped with scaletrain, in file order."""
    out = []
    folder = resources.files("scaletrain.perf").joinpath("published")
    for f in sorted((p for p in folder.iterdir() if p.name.endswith(".toml")), key=lambda p: p.name):
        data = tomllib.loads(f.read_text())
        for r in data["row"]:
            out.append(Row(**{k: r.get(k, data.get(k)) for k in (fl.name for fl in dataclasses.fields(Row))}))
    return out


def predict_row(row: Row, hw: Hardware | None = None) -> dict[str, Any]:
    """The prediction of one row on its profile (or `hw`, e.g. with other efficiencies): predict_config's
    point, through the data-sheet predictor as `predict --hardware` makes it."""
    # the published runs decode on the GPU (DALI) and copy compressed JPEGs ahead, off the training stream:
    # no copy of float images before each forward, which the profile's host link would price
    hw = dataclasses.replace(hw or load_hardware(row.profile), pcie_bytes_per_s=None)
    return predict_on(hw, model=row.model, image_size=row.image_size, batch_size=row.batch_per_gpu,
                      precision=row.precision, gpus=row.gpus)


def predict_on(hw: Hardware, *, model: str, image_size: int, batch_size: int, precision: str, gpus: int = 1,
               **settings: Any) -> dict[str, Any]:
    """One run on `gpus` devices of profile `hw` (whole nodes beyond one), on synthetic data, priced as
    `predict --hardware` prices it; `settings` are further configuration fields (strategy, ...)."""
    from scaletrain.config import build_config
    from scaletrain.predict.cli import network_from
    from scaletrain.predict.points import predict_config
    from scaletrain.predict.scaling import make_predictor

    cfg = build_config({}, {"model": model, "image_size": image_size, "batch_size": batch_size,
                            "precision": precision, "nproc": min(gpus, hw.count),
                            "nnodes": max(1, gpus // hw.count), "dataset": "synthetic",
                            "synthetic_samples": 8 * batch_size * gpus, "synthetic_classes": 1000,
                            **({"master_addr": "node0"} if gpus > hw.count else {}), **settings})
    args = type("Args", (), {"network": None, "link": None, "latency": None})()
    return predict_config(make_predictor(None, network_from(args, None, hw), hw), cfg)


def predict_flags(hw: Hardware, flags: list[str], image_size: int = 224) -> dict[str, Any]:
    """A run recorded by benchmarks/gpu_measure.py (its `scaletrain train` flags: --model, --batch-size,
    --precision, --strategy; ResNet-50, batch 256, fp32 and the default strategy where absent) priced on `hw`,
    one device."""
    def flag(name: str, default: str) -> str:
        return flags[flags.index(name) + 1] if name in flags else default

    return predict_on(hw, model=flag("--model", "resnet50"), image_size=image_size,
                      batch_size=int(flag("--batch-size", "256")), precision=flag("--precision", "fp32"),
                      **({"strategy": flag("--strategy", "")} if "--strategy" in flags else {}))


def with_efficiency(hw: Hardware, **fractions: float) -> Hardware:
    return dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, **fractions))


def default_efficiency() -> Efficiency:
    return Efficiency()
