"""Activation checkpointing (train/recompute.py): which modules it checkpoints, and that it changes nothing but
memory: float64 losses, gradients and batch-norm statistics equal to a run without it, fewer bytes saved."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from scaletrain.models import build_model
from scaletrain.train import recompute
from scaletrain.train.recompute import Unit


def _sequential() -> nn.Module:
    """A Sequential model with batch norm and dropout: blocks are runs of its children."""
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                         nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.5),
                         nn.Linear(64, 10))


def test_units_are_the_residual_blocks():
    model = build_model("resnet20", num_classes=10, in_channels=1, image_size=8)
    names = [u.name for u in recompute.plan_units(model, (1, 8, 8))]
    assert names == ["stem"] + [f"layer{i}.{j}" for i in (1, 2, 3) for j in (0, 1, 2)]  # fc: one layer, left out


def test_units_of_a_sequential_are_runs_of_its_children():
    units = recompute.plan_units(_sequential(), (1, 8, 8))
    assert all(u.path == "" and u.first is not None for u in units)
    assert [u.name for u in units][0] == "0-2"
    spans = [(u.first, u.last) for u in units]
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))  # in order, not overlapping


def test_units_of_nested_sequentials():
    model = build_model("lenet5", num_classes=10, in_channels=1, image_size=32)
    assert [u.name for u in recompute.plan_units(model, (1, 32, 32))][:2] == ["features.0-2", "features.3-5"]


def test_covers():
    assert Unit("layer1.0").covers("layer1.0.conv1") and Unit("layer1.0").covers("layer1.0")
    assert not Unit("layer1.0").covers("layer1.01.conv1") and not Unit("layer1.0").covers("layer1.1.conv1")
    segment = Unit("features", 0, 3)
    assert segment.covers("features.3") and segment.covers("features.0.conv")
    assert not segment.covers("features.4") and not segment.covers("classifier.0")
    assert Unit("", 2, 4).covers("3") and not Unit("", 2, 4).covers("5")


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """One training forward and backward: the loss, each parameter's gradient, the buffers after it, and the
    bytes autograd saved for backward (measured as it packs them; a checkpointed block's own are not)."""
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    torch.manual_seed(5)  # dropout draws the same masks in both
    with saved_tensors_hooks(pack, lambda t: t):
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.item(), [p.grad for p in model.parameters()], [b.clone() for b in model.buffers()], saved[0]


@pytest.mark.parametrize("name", ["resnet20", "sequential"])
def test_checkpointing_changes_no_gradient_float64(name):
    torch.manual_seed(0)
    model = (build_model("resnet20", num_classes=10, in_channels=1, image_size=8) if name == "resnet20"
             else _sequential()).double()
    checkpointed = copy.deepcopy(model)
    recompute.apply(checkpointed, recompute.plan_units(checkpointed, (1, 8, 8)))
    x, y = torch.randn(4, 1, 8, 8, dtype=torch.float64), torch.randint(0, 10, (4,))
    loss, grads, buffers, saved = _step(model, x, y)
    loss2, grads2, buffers2, saved2 = _step(checkpointed, x, y)
    assert loss == loss2
    assert all(torch.equal(a, b) for a, b in zip(grads, grads2))
    # batch norm's running statistics moved once, as without checkpointing (not again in the recompute)
    assert all(torch.equal(a, b) for a, b in zip(buffers, buffers2))
    assert any(b.float().abs().sum() > 0 for b in buffers2 if b.dtype != torch.int64)
    assert saved2 < saved / 2
    assert list(model.state_dict()) == list(checkpointed.state_dict())  # names unchanged: checkpoints load


def test_pipeline_pieces_chain_equals_the_stage():
    from scaletrain.split.stages import block_pieces, blocked, stage_module

    torch.manual_seed(0)
    model = build_model("resnet20", num_classes=10, in_channels=1, image_size=8).double()
    graph = blocked(model, (1, 8, 8), 2)
    pieces = block_pieces(graph, 0, 5)
    assert [names for names, _ in pieces] == [[name] for name in graph.names[:5]]
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64, requires_grad=True)
    whole = stage_module(graph, 0, 5)(x)
    chained = recompute.Chain([p for _, p in pieces], [True, False, True, True, False])(x)
    assert torch.equal(whole, chained)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [["--strategy", "allreduce", "--nproc", "2"],
                                      ["--strategy", "fsdp", "--nproc", "2"],
                                      ["--strategy", "pipeline", "--nproc", "2", "--microbatches", "2"],
                                      ["--strategy", "spatial", "--spatial", "2", "--nproc", "2"]],
                         ids=["allreduce", "fsdp", "pipeline", "spatial"])
def test_training_with_checkpointing_equals_without(tmp_path, run_cli, strategy):
    """An epoch of ResNet-20 on digits in float64: the same weights (digests) with and without checkpointing."""
    common = ["train", "--model", "resnet20", "--epochs", "1", "--batch-size", "16", "--precision", "fp64",
              "--image-size", "8", "--no-progress", "--tensorboard", "off", "--threads", "1", *strategy]
    summaries = []
    for mode in ("none", "blocks"):
        out = tmp_path / mode
        done = run_cli(*common, "--checkpoint-activations", mode, "--out", str(out))
        assert done.returncode == 0, done.stderr
        summaries.append(json.loads((out / "summary.json").read_text()))
    plain, checkpointed = summaries
    assert plain["param_digests"] == checkpointed["param_digests"]
    assert plain["checkpointed_blocks"] == [] and "layer1.0" in checkpointed["checkpointed_blocks"]
    if "spatial" in checkpointed:  # the recomputed forward exchanges its halos again: counted, and in the theory
        s = checkpointed["spatial"]
        assert s["halo_bytes_per_step"] == s["halo_bytes_per_step_theory"] > plain["spatial"]["halo_bytes_per_step"]


@pytest.mark.slow
def test_checkpointing_lowers_the_measured_peak(tmp_path, run_cli):
    """ResNet-18 at 1024 px, batch 2: the peak resident memory with checkpointing is lower. With the lean allocator
    (freed memory goes back), so that the peak follows the live tensors, not what glibc kept of earlier steps:
    measured 1,352 / 1,003 MiB twice (2026-11-28); the default policy's peaks moved 1,593-1,687 / 1,406-1,529 MiB
    between runs, a saving of 64-281 MiB."""
    peaks = {}
    for mode in ("none", "blocks"):
        out = tmp_path / mode
        done = run_cli("train", "--model", "resnet18", "--dataset", "synthetic", "--synthetic-samples", "4",
                       "--batch-size", "2", "--epochs", "1", "--image-size", "1024", "--no-progress",
                       "--tensorboard", "off", "--checkpoint-activations", mode, "--allocator", "lean",
                       "--out", str(out))
        assert done.returncode == 0, done.stderr
        summary = json.loads((out / "summary.json").read_text())
        peaks[mode] = max(r["peak_memory_bytes"] for r in summary["ranks"])
    assert peaks["blocks"] < peaks["none"] - 250 * 2 ** 20, peaks


def test_predict_prices_the_recomputed_forward():
    """The performance model adds the checkpointed blocks' share of the forward to backward (their FLOPs' share:
    everything but ResNet-20's classifier), and changes nothing else."""
    from predict_fixtures import NETWORK, fake_calibration
    from scaletrain.config import build_config
    from scaletrain.predict.points import predict_config, recomputed_share
    from scaletrain.predict.predictor import Predictor

    p = Predictor(fake_calibration(), NETWORK)
    plain, again = (predict_config(p, build_config({}, {"model": "resnet20", "batch_size": 32,
                                                         "checkpoint_activations": mode}))
                    for mode in ("none", "blocks"))
    share = recomputed_share(build_config({}, {"model": "resnet20", "checkpoint_activations": "blocks"}),
                             {"classes": 10, "channels": 1, "image_size": 32})
    assert 0.95 < share < 1.0
    fwd = plain["phases_s"]["forward"]
    assert again["phases_s"]["forward"] == pytest.approx(fwd)
    assert again["phases_s"]["backward"] == pytest.approx(plain["phases_s"]["backward"] + share * fwd, rel=0.02)
