"""perf/memory.py is the one source of the memory numbers: the pre-flight check, `predict` and `split` agree
on a rank's parameter copies and on what an activation takes at each precision."""

from __future__ import annotations

import pytest
import torch

from predict_fixtures import NETWORK, fake_calibration
from scaletrain.config import build_config
from scaletrain.models.registry import build_model
from scaletrain.perf.footprint import model_memory
from scaletrain.perf.memory import OPTIMIZER_STATE, activations_at, data_parallel_copies
from scaletrain.predict.points import predict_config
from scaletrain.predict.predictor import Predictor


def test_autocast_keeps_every_activation_in_16_bits():
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2))
    dtypes = []
    for layer in m:
        layer.register_forward_hook(lambda mod, i, o: dtypes.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m(torch.randn(2, 3, 16, 16))
    assert dtypes == [torch.bfloat16] * 4
    assert activations_at(4000, "bf16") == 2000 and activations_at(4000, "fp32") == 4000


@pytest.mark.parametrize("optimizer", ["sgd", "adamw", "adagrad"])
def test_the_preflight_check_and_predict_count_the_same_parameter_copies(optimizer):
    factory = lambda: build_model("lenet5", num_classes=10, in_channels=1, image_size=32)  # noqa: E731
    params = sum(p.numel() for p in factory().parameters())
    preflight = model_memory(factory, 32, (1, 32, 32), optimizer, "fp32").state_bytes()
    assert preflight == 4 * params * data_parallel_copies(optimizer)
    cfg = build_config({}, {"model": "lenet5", "nproc": 2, "batch_size": 32, "optimizer": optimizer})
    mem = predict_config(Predictor(fake_calibration(), NETWORK), cfg)["memory_bytes"]
    assert mem["parameters"] + mem["gradients"] + mem["optimizer"] + mem["buckets"] == preflight
    assert mem["optimizer"] == 4 * params * OPTIMIZER_STATE[optimizer]


def test_predict_halves_the_activations_under_bf16():
    p = Predictor(fake_calibration(precisions=("fp32", "bf16")), NETWORK)
    fp32, bf16 = (predict_config(p, build_config({}, {"model": "lenet5", "batch_size": 32, "precision": prec}))
                  for prec in ("fp32", "bf16"))
    assert bf16["memory_bytes"]["activations"] * 2 == fp32["memory_bytes"]["activations"]
