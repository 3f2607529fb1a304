"""perf/memory.py is the one source of the memory numbers: the pre-flight check, `predict` and `split` agree
on a rank's parameter copies and on what an activation takes at each precision."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from predict_fixtures import NETWORK, fake_calibration
from scaletrain.config import build_config
from scaletrain.models.registry import build_model
from scaletrain.perf.footprint import model_memory
from scaletrain.perf.memory import OPTIMIZER_STATE, activations_at, data_parallel_copies
from scaletrain.comm.memory import per_rank
from scaletrain.predict.points import data_facts, model_factory, predict_config, sample_shape
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
    assert mem["params"] == preflight == 4 * params * (3 + OPTIMIZER_STATE[optimizer])


@pytest.mark.parametrize("flags", [{"strategy": "allreduce"}, {"strategy": "ring"}, {"strategy": "fsdp"},
                                   {"strategy": "ps-sync", "nproc": 3},
                                   {"strategy": "allreduce", "checkpoint_activations": "blocks"},
                                   {"strategy": "spatial", "spatial": 2, "model": "resnet18", "image_size": 64},
                                   {"strategy": "allreduce", "dataset": "digits", "image_size": 32}])
def test_predict_holds_each_layout_to_the_preflight_checks_memory_model(flags):
    """One memory model: the memory per rank `predict` prints is, part by part, what `train
    --memory-per-device` plans for the same request (comm/memory.per_rank, the strategy's own `memory`)."""
    flags = {"model": "lenet5", "nproc": 2, "batch_size": 8, "dataset": "synthetic", "image_size": 32} | flags
    cfg = build_config({}, flags)
    point = predict_config(Predictor(fake_calibration(), NETWORK), cfg)
    facts = data_facts(cfg.data.dataset, cfg.data.image_size, cfg.data.synthetic_samples,
                       cfg.data.synthetic_classes)
    want = per_rank(cfg, model_factory(cfg, facts), sample_shape(facts), "cpu")
    assert point["memory_bytes"] == dataclasses.asdict(want)
    assert point["peak_memory_bytes"] == want.total > want.runtime > 0
    state = 4 * sum(p.numel() for p in model_factory(cfg, facts)().parameters())
    held = {"allreduce": 4, "ring": 4, "ps-sync": 2}  # weights, gradients, momentum, DDP's bucket copy; ps: no state
    if cfg.strategy.name in held:
        assert want.params == held[cfg.strategy.name] * state
    if cfg.data.dataset == "digits":
        assert want.dataset == 1797 * 32 * 32 * 4


def test_predict_halves_the_activations_under_bf16():
    p = Predictor(fake_calibration(precisions=("fp32", "bf16")), NETWORK)
    fp32, bf16 = (predict_config(p, build_config({}, {"model": "lenet5", "batch_size": 32, "precision": prec}))
                  for prec in ("fp32", "bf16"))
    assert bf16["memory_bytes"]["activations"] * 2 == fp32["memory_bytes"]["activations"]


def test_fresh_pages_are_measured_as_a_rate():
    from scaletrain.distributed.pages import measure

    m = measure(rounds=3, size=8 * 2**20)
    assert m["seconds_per_byte"] >= 0 and len(m["fresh_s"]) == len(m["kept_s"]) == 3 and min(m["fresh_s"]) > 0


def test_a_point_that_runs_lean_says_its_steps_are_slower_than_priced():
    from scaletrain.predict.points import LEAN_NOTE

    p = Predictor(fake_calibration(), NETWORK)
    flags = {"model": "lenet5", "nproc": 2, "batch_size": 8, "dataset": "synthetic", "image_size": 32}
    budgeted = predict_config(p, build_config({}, {**flags, "memory_per_device": "8GiB"}))
    assert LEAN_NOTE in budgeted["notes"]
    assert LEAN_NOTE not in predict_config(p, build_config({}, flags))["notes"]
    assert LEAN_NOTE not in predict_config(p, build_config({}, {**flags, "memory_per_device": "8GiB",
                                                                "allocator": "steady"}))["notes"]


def test_split_counts_a_stage_as_a_pipeline_run_of_that_split_plans_it(tmp_path, monkeypatch):
    """`scaletrain split --memory-per-stage` reads the one memory model: its split's largest stage is, byte for byte,
    the parameters and activations comm/memory.per_rank gives the fullest rank of a pipeline run of that split under a
    budget (what the pre-flight check and `predict` count)."""
    import json

    from scaletrain.cli import main
    from scaletrain.predict import calibration

    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))
    cal = calibration.save(fake_calibration(), tmp_path / "cal.json")
    out = tmp_path / "split"
    assert main(["split", "--model", "resnet20", "--stages", "2", "--microbatches", "2", "--batch-size", "8",
                 "--optimizer", "adamw", "--memory-per-stage", "1GiB", "--calibration", str(cal),
                 "--out", str(out)]) == 0
    report = json.loads((out / "split.json").read_text())
    assert not any("blocks' bytes" in n for n in report["notes"])
    cfg = build_config({}, {"model": "resnet20", "strategy": "pipeline", "nproc": 2, "stages": 2, "microbatches": 2,
                            "batch_size": 8, "optimizer": "adamw", "dataset": "synthetic", "image_size": 32,
                            "split": str(out / "split.json"), "memory_per_device": "4GiB"})
    want = per_rank(cfg, lambda: build_model("resnet20", num_classes=10, in_channels=3, image_size=32), (3, 32, 32),
                    "cpu")
    assert report["chosen"]["peak_memory_bytes"] == want.params + want.activations > 0
    first = report["chosen"]["stages"][0]["memory"]
    assert first["optimizer"] == 2 * first["weights"] and first["activations"] > 0  # adamw; 1F1B: 2 in flight
