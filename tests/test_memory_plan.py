"""Memory per rank, per layout (perf/peak.py, comm/memory.py, `train --memory-per-device`, `predict --image-size
max`): the peak's formulas, each layout's share, the refusal before spawning, and (slow) runs under the budget."""

from __future__ import annotations

import json

from dataclasses import replace

import pytest

from scaletrain.comm.memory import alternatives, per_rank, within
from scaletrain.config import config_from_dict
from scaletrain.errors import UserError
from scaletrain.models import build_model
from scaletrain.perf.peak import TRANSIENT, BlockBytes, peak

MiB = 2 ** 20


def _blocks() -> list[BlockBytes]:
    return [BlockBytes("a", saved=100, input=10, largest=40), BlockBytes("b", saved=50, input=20, largest=10),
            BlockBytes("c", saved=30, input=5, largest=5)]


def test_peak_without_checkpointing_holds_every_earlier_block():
    # backward at c holds a's and b's saved tensors besides its own peak (saved + T x largest); at a, a's alone
    expected = max(100 + TRANSIENT * 40, 100 + 50 + TRANSIENT * 10, 150 + 30 + TRANSIENT * 5)
    assert peak(_blocks()) == expected


def test_peak_with_checkpointing_holds_inputs_and_one_block():
    expected = max(10 + 100 + TRANSIENT * 40, 30 + 50 + TRANSIENT * 10, 35 + 30 + TRANSIENT * 5)
    assert peak(_blocks(), checkpointed=True) == expected
    assert peak(_blocks(), checkpointed=frozenset({"a"})) == max(10 + 100 + TRANSIENT * 40, 10 + 50 + TRANSIENT * 10,
                                                                  60 + 30 + TRANSIENT * 5)
    assert peak([]) == 0


def test_peak_inside_a_block_frees_what_backward_has_passed():
    b = BlockBytes("a", saved=100, input=10, largest=40, inner=70)
    assert b.backward_peak == 70 and peak([b, b]) == 100 + 70
    assert b.tiled(0.5).backward_peak == 35 and replace(b, tiled_inner=90).tiled(0.5).backward_peak == 45


def test_peak_with_a_retaining_allocator_adds_the_small_blocks_high_water():
    # a: large (40 >= 20), b and c small: their high-water stays while a's backward runs
    small = max(50 + TRANSIENT * 10, 50 + 30 + TRANSIENT * 5)
    assert peak(_blocks(), retained_below=20) == small + 100 + TRANSIENT * 40
    assert peak(_blocks(), retained_below=1000) == peak(_blocks())


def test_inner_peak_from_the_layers():
    """ResNet-20's blocks on the meta device: inside each, the peak over its layers is at most all its saved
    tensors with T x its largest output, and at least the two gradients of its largest output."""
    from scaletrain.perf.footprint import model_memory

    mm = model_memory(lambda: build_model("resnet20", num_classes=10, in_channels=1, image_size=32), 4, (1, 32, 32),
                      "sgd", "fp32")
    assert all(b.inner is not None and 2 * b.largest <= b.inner <= b.saved + TRANSIENT * b.largest
               for b in mm.blocks)
    # on tiles (comm/spatial/layers.py) a convolution's backward makes its padded input again
    assert all(b.tiled_inner is not None and b.inner <= b.tiled_inner <= b.saved + TRANSIENT * b.largest
               for b in mm.blocks)


def _cfg(side: int, **extra):
    return config_from_dict({"model": "resnet18", "dataset": "synthetic", "batch_size": 1, "image_size": side,
                             "nproc": 2, **extra})


def _need(side: int, **extra) -> dict:
    cfg = _cfg(side, **extra)
    f = per_rank(cfg, lambda: build_model("resnet18", num_classes=10, in_channels=3, image_size=side), (3, side, side),
                 runtime=0)
    return f


def test_each_layout_holds_its_share():
    ddp, ckpt = _need(512), _need(512, checkpoint_activations="blocks")
    spatial = _need(512, strategy="spatial", spatial=2)
    fsdp = _need(512, strategy="fsdp")
    assert spatial.activations < 0.7 * ddp.activations and spatial.params < ddp.params  # no DDP bucket copy
    assert fsdp.params < 0.6 * ddp.params and fsdp.activations == ddp.activations
    assert ckpt.params == ddp.params and ckpt.batches == ddp.batches == 2 * 3 * 512 * 512 * 4
    assert ddp.runtime == 0 and ddp.total == ddp.params + ddp.activations + ddp.batches


def test_alternatives_name_the_flags_that_ask_for_them():
    flags = [f for f, _ in alternatives(_cfg(256))]
    assert "--checkpoint-activations blocks" in flags and "--strategy spatial --spatial 2" in flags
    assert "--strategy pipeline --nproc 2 --microbatches 2 --batch-size 2" in flags
    assert [f for f, _ in alternatives(_cfg(256, nproc=1))] == ["--checkpoint-activations blocks"]
    four = [f for f, _ in alternatives(_cfg(256, nproc=4))]
    assert "--strategy spatial --spatial 2 --stages 2 --microbatches 2 --batch-size 2" in four
    assert "--strategy spatial --spatial 2 --stages 2 --microbatches 2 --batch-size 2 --checkpoint-activations blocks" \
        in four


def test_tiles_in_pipeline_stages_hold_less_than_the_pipeline_on_whole_images():
    piped = _need(512, strategy="pipeline", microbatches=2, batch_size=2)
    tiled = _need(512, strategy="spatial", spatial=2, stages=2, microbatches=2, batch_size=2, nproc=4)
    assert tiled.activations < 0.7 * piped.activations
    assert tiled.params <= piped.params * 1.5  # a stage's weights either way (the split may differ)


def test_train_refuses_a_run_over_the_budget_naming_layouts_that_fit():
    from scaletrain.distributed.launch.preflight import validate

    cfg = _cfg(1024, memory_per_device="1200MiB", allocator="steady")
    with pytest.raises(UserError) as e:
        validate(cfg)
    message = str(e.value)
    assert "more than --memory-per-device 1200MiB less a 10% margin" in message
    assert "--strategy spatial --spatial 2" in message
    assert "\n" not in message
    with pytest.raises(UserError, match="no layout of these ranks fits: lower --image-size"):
        validate(_cfg(1024, memory_per_device="300MiB"))
    validate(_cfg(256, memory_per_device="4GiB"))  # fits: no refusal


def test_auto_allocator_is_lean_under_a_budget(capsys):
    """A CPU run with --memory-per-device runs lean (said in one line), whose resident peak is the live one the model
    prices (a smaller plan than steady's, whose heap keeps what is freed); with no budget, steady."""
    from scaletrain.distributed.launch.preflight import validate

    assert _need(1024, allocator="lean").activations < _need(1024, allocator="steady").activations
    assert validate(_cfg(1024, memory_per_device="8GiB")).launch.allocator == "lean"
    assert "--allocator auto: lean" in capsys.readouterr().err
    assert validate(_cfg(1024)).launch.allocator == "steady"
    assert "--allocator" not in capsys.readouterr().err
    assert validate(_cfg(1024, memory_per_device="8GiB", allocator="steady")).launch.allocator == "steady"
    assert "--allocator steady: glibc's heap may grow past" in capsys.readouterr().err  # said, not refused


def test_a_budget_that_is_not_a_size_is_refused():
    with pytest.raises(UserError, match="--memory-per-device 'lots'"):
        _cfg(64, memory_per_device="lots")


def test_the_largest_side_is_the_last_step_within_the_budget():
    from scaletrain.predict.largest import STEP, _largest

    cfg = config_from_dict({"model": "resnet20", "dataset": "synthetic", "batch_size": 1, "nproc": 2})

    def build(c, side):
        return lambda: build_model("resnet20", num_classes=10, in_channels=3, image_size=side)

    found = _largest("as given", cfg, build, 3, 400 * MiB, "cpu", 0)
    assert found.side % STEP == 0 and within(found.bytes, 400 * MiB)
    bigger = per_rank(cfg.replace(image_size=found.side + STEP), build(cfg, found.side + STEP),
                      (3, found.side + STEP, found.side + STEP), runtime=0)
    assert not within(bigger.total, 400 * MiB)  # one step more does not fit


@pytest.mark.slow
def test_predict_image_size_max(tmp_path, run_cli):
    out = tmp_path / "max"
    done = run_cli("predict", "--model", "resnet20", "--dataset", "synthetic", "--batch-size", "1", "--nproc", "2",
                   "--image-size", "max", "--memory-per-device", "700MiB", "--out", str(out))
    assert done.returncode == 0, done.stderr
    layouts = {r["layout"]: r for r in json.loads((out / "largest-side.json").read_text())["layouts"]}
    given, spatial = layouts["as given"], layouts["--strategy spatial --spatial 2"]
    assert given["largest_side"] % 64 == 0 and spatial["largest_side"] > given["largest_side"]
    assert all(r["bytes_per_rank"] <= 700 * MiB for r in layouts.values() if r["largest_side"])
    missing = run_cli("predict", "--model", "resnet20", "--image-size", "max", "--out", str(tmp_path / "x"))
    assert missing.returncode != 0 and "give --memory-per-device" in missing.stderr


@pytest.mark.slow
def test_layouts_the_model_says_fit_train_under_the_budget(tmp_path, run_cli):
    """ResNet-18, batch 1, 2 ranks, 1.5 GiB: DDP and 2 tiles at the largest side the model gives them train a
    step with the measured peak (resident, max over ranks) within the budget; 128 px more is refused before any
    process starts."""
    plan = tmp_path / "plan"
    done = run_cli("predict", "--model", "resnet18", "--dataset", "synthetic", "--batch-size", "1", "--nproc", "2",
                   "--image-size", "max", "--memory-per-device", "1536MiB", "--out", str(plan))
    assert done.returncode == 0, done.stderr
    layouts = {r["layout"]: r for r in json.loads((plan / "largest-side.json").read_text())["layouts"]}
    common = ["train", "--model", "resnet18", "--dataset", "synthetic", "--synthetic-samples", "4", "--batch-size", "1",
              "--epochs", "1", "--nproc", "2", "--threads", "1", "--no-progress", "--tensorboard", "off",
              "--memory-per-device", "1536MiB"]
    for flags in ("as given", "--strategy spatial --spatial 2"):
        side = layouts[flags]["largest_side"]
        extra = [] if flags == "as given" else flags.split()
        out = tmp_path / flags.replace(" ", "_")
        done = run_cli(*common, *extra, "--image-size", str(side), "--out", str(out))
        assert done.returncode == 0, done.stderr
        summary = json.loads((out / "summary.json").read_text())
        assert max(r["peak_memory_bytes"] for r in summary["ranks"]) <= 1536 * MiB
        over = run_cli(*common, *extra, "--image-size", str(side + 128), "--out", str(tmp_path / "over"))
        assert over.returncode != 0 and "more than --memory-per-device" in over.stderr
        assert not (tmp_path / "over").exists()


def _resnet20(side: int):
    return lambda: build_model("resnet20", num_classes=10, in_channels=3, image_size=side)


def test_auto_checkpoints_the_fewest_blocks_that_fit():
    from scaletrain.comm.memory import resolve_checkpointing

    def plan(value: str, budget: str = "4GiB") -> int:
        cfg = _cfg(128, model="resnet20", batch_size=64, checkpoint_activations=value, memory_per_device=budget)
        return per_rank(cfg, _resnet20(128), (3, 128, 128)).total

    plain, every = plan("none"), plan("blocks")
    assert every < plain
    budget = int((every + plain) / 2 * 1.1)  # between: some blocks, not all
    cfg = _cfg(128, model="resnet20", batch_size=64, checkpoint_activations="auto", memory_per_device=str(budget))
    names = resolve_checkpointing(cfg, _resnet20(128), (3, 128, 128), "cpu").model.checkpoint_activations
    chosen = names.split(",")
    assert 0 < len(chosen) < 10 and within(plan(names), budget)
    assert not within(plan(",".join(chosen[:-1]) or "none"), budget)  # one fewer does not fit
    roomy = cfg.replace(memory_per_device="64GiB")
    assert resolve_checkpointing(roomy, _resnet20(128), (3, 128, 128), "cpu").model.checkpoint_activations == "none"


def test_named_blocks_are_checked():
    from scaletrain.train import recompute

    model = build_model("resnet20", num_classes=10, in_channels=1, image_size=8)
    units = recompute.plan_units(model, (1, 8, 8), "stem,layer2.1")
    assert [u.name for u in units] == ["stem", "layer2.1"] and [u.block for u in units] == ["stem", "layer2.1"]
    with pytest.raises(UserError, match="no block named layer9.0; the blocks are stem, layer1.0"):
        recompute.plan_units(model, (1, 8, 8), "stem,layer9.0")
    with pytest.raises(UserError, match="--checkpoint-activations 'stem,,fc'"):
        _cfg(64, checkpoint_activations="stem,,fc")


@pytest.mark.slow
def test_train_auto_checkpointing_fits_the_budget(tmp_path, run_cli):
    """ResNet-18 at 1,792 px, batch 1, 2 ranks, 2 GiB (so the lean allocator): too much without checkpointing by
    the plan; auto picks blocks, says which, and the run's measured peak stays within the budget."""
    out = tmp_path / "auto"
    done = run_cli("train", "--model", "resnet18", "--dataset", "synthetic", "--synthetic-samples", "4",
                   "--batch-size", "1", "--epochs", "1", "--nproc", "2", "--threads", "1", "--no-progress",
                   "--tensorboard", "off", "--image-size", "1792", "--memory-per-device", "2GiB",
                   "--checkpoint-activations", "auto", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "--checkpoint-activations auto: stem" in done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checkpointed_blocks"] and max(r["peak_memory_bytes"] for r in summary["ranks"]) <= 2 * 2 ** 30


def test_spatial_until_auto_is_the_shallowest_front_that_fits():
    from scaletrain.comm.registry import strategy_class

    cfg = _cfg(256, strategy="spatial", spatial=2)
    spatial = strategy_class("spatial")
    factory = lambda: build_model("resnet18", num_classes=10, in_channels=3, image_size=256)  # noqa: E731
    chosen = spatial.resolve(cfg, factory, (3, 256, 256), lambda c: c.spatial.until in ("layer2", "layer3"))
    assert chosen.spatial.until == "layer2"
    assert spatial.resolve(cfg, factory, (3, 256, 256), lambda c: False).spatial.until == "layer4"  # the deepest
    given = cfg.replace(spatial_until="layer1")
    assert spatial.resolve(given, factory, (3, 256, 256), lambda c: True) is given
    from scaletrain.distributed.launch.preflight import validate

    assert validate(cfg.replace(memory_per_device="8GiB")).spatial.until == "stem"  # everything fits: the earliest
    assert validate(cfg).spatial.until == "auto"  # no budget: the strategy's own auto (the deepest)


def test_a_budget_splits_the_pipeline_within_it():
    """ResNet-18 at 1536 px, 2 stages of 2 micro-batches: the fastest split (on FLOPs) puts the stem with half the
    work on stage 0, which holds both micro-batches in flight, over 2 GiB; within the budget the model moves the cut
    until both stages fit."""
    def need(**budget):
        cfg = _cfg(1536, strategy="pipeline", microbatches=2, batch_size=2, **budget)
        return per_rank(cfg, lambda: build_model("resnet18", num_classes=10, in_channels=3, image_size=1536),
                        (3, 1536, 1536), runtime=411 * MiB).total

    assert not within(need(), 2 * 2 ** 30) and within(need(memory_per_device="2GiB"), 2 * 2 ** 30)


def test_partition_keeps_to_the_memory_models_word():
    from scaletrain.split.partition import BlockCost, Infeasible, optimal

    costs = [BlockCost(str(i), 1.0, 2.0, 0, 0, 0) for i in range(6)]
    assert optimal(costs, 2, microbatches=2, schedule="1f1b").bounds[0][1] > 1

    def memory(s, i, j):  # stage 0 fits only with one block
        return {"weights": 0, "gradients": 0, "optimizer": 0, "activations": 0, "working": 10 * (j - i) * (s == 0)}

    held = optimal(costs, 2, microbatches=2, schedule="1f1b", memory=memory, memory_limit=10)
    assert held.bounds == [(0, 1), (1, 6)] and all(st["fits"] for st in held.stages)
    with pytest.raises(Infeasible):
        optimal(costs, 2, microbatches=2, schedule="1f1b", memory=memory, memory_limit=9)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, extra", [("allreduce", {}), ("ring", {}), ("ps-sync", {"ps_servers": 1}),
                                             ("fsdp", {}), ("pipeline", {"stages": 2, "microbatches": 4})])
def test_the_memory_model_meets_each_strategys_measured_growth(tmp_path, run_cli, strategy, extra):
    """One memory model, every strategy, against real runs: under the lean allocator (resident = live) the fullest
    rank's peak grows from batch 16 to 64 by what comm/memory.per_rank says, within 15% (measured 0.98-0.99x here,
    docs/predict-validation.md; another CPU's convolutions may keep other scratch); the batch-independent rest (the
    process, torch) cancels."""
    from scaletrain.config import build_config

    grown = {}
    for batch in (16, 64):
        out = tmp_path / str(batch)
        done = run_cli("train", "--model", "resnet20", "--dataset", "synthetic", "--image-size", "64", "--nproc", "2",
                       "--threads", "1", "--epochs", "1", "--batch-size", str(batch), "--synthetic-samples",
                       str(8 * batch), "--strategy", strategy,
                       *[a for k, v in extra.items() for a in (f"--{k.replace('_', '-')}", str(v))],
                       "--allocator", "lean", "--no-progress",
                       "--tensorboard", "off", "--out", str(out))
        assert done.returncode == 0, done.stderr
        measured = max(r["peak_memory_bytes"] for r in json.loads((out / "summary.json").read_text())["ranks"])
        flags = {"model": "resnet20", "dataset": "synthetic", "image_size": 64, "nproc": 2, "batch_size": batch,
                 "strategy": strategy, "allocator": "lean", **extra}
        planned = per_rank(build_config({}, flags), lambda: build_model("resnet20", num_classes=10, in_channels=3,
                                                                        image_size=64), (3, 64, 64), "cpu")
        grown[batch] = (measured, planned.total)
    measured_growth = grown[64][0] - grown[16][0]
    model_growth = grown[64][1] - grown[16][1]
    assert model_growth > 50 * MiB
    assert measured_growth == pytest.approx(model_growth, rel=0.15)


def test_the_fronts_graph_is_walked_once_per_model_and_shape(monkeypatch):
    """comm/spatial/front._graph keeps its walks (a plan asks for the front of one model at every candidate): the
    same model built again is not walked again; another shape or another model is."""
    from collections import OrderedDict

    from scaletrain.comm.spatial import front
    from scaletrain.comm.spatial.geometry import TileGrid, square_grid

    walked, real = [], front.layer_graph
    monkeypatch.setattr(front, "layer_graph", lambda m, shape, b: walked.append(shape) or real(m, shape, b))
    monkeypatch.setattr(front, "_kept", OrderedDict())
    build = lambda name, side: build_model(name, num_classes=10, in_channels=3, image_size=side)  # noqa: E731
    grid = TileGrid(*square_grid(2))
    first = front.plan_front(build("resnet20", 64), "auto", grid, (3, 64, 64))
    assert front.plan_front(build("resnet20", 64), "auto", grid, (3, 64, 64)) == first
    assert front.front_ends(build("resnet20", 64), (3, 64, 64))[-1] == first.until and walked == [(3, 64, 64)]
    front.plan_front(build("resnet20", 128), "auto", grid, (3, 128, 128))
    front.plan_front(build("resnet56", 64), "auto", grid, (3, 64, 64))
    assert walked == [(3, 64, 64), (3, 128, 128), (3, 64, 64)]


def test_auto_ends_the_front_where_the_tiles_still_divide_the_layers():
    """`--spatial-until auto` takes the deepest end whose layers divide into the tiles at this image size: ResNet-18
    at 96 px on 2 tiles reaches layer3 (layer4's strided convolution would get a 3 px tile); naming layer4 is
    refused with that reason; a side no end divides is refused with the shallowest's."""
    import torch

    from scaletrain.comm.spatial.front import front_ends, plan_front
    from scaletrain.comm.spatial.geometry import TileGrid, square_grid

    grid = TileGrid(*square_grid(2))
    with torch.device("meta"):
        model = build_model("resnet18", num_classes=10, in_channels=3, image_size=96)
    assert front_ends(model, (3, 96, 96))[-1] == "layer4"
    assert front_ends(model, (3, 96, 96), grid)[-1] == "layer3"
    assert plan_front(model, "auto", grid, (3, 96, 96)).until == "layer3"
    with pytest.raises(UserError, match="layer4.0.conv1 cannot run on tiles: a tile.s width there is 3,"):
        plan_front(model, "layer4", grid, (3, 96, 96))
    with pytest.raises(UserError, match="stem.0 cannot run on tiles: a tile.s width there is 33,"):
        plan_front(model, "auto", grid, (3, 66, 66))


def test_a_layouts_part_is_priced_once_for_configurations_that_differ_in_loader_workers_alone(monkeypatch):
    """A plan's candidates that differ in --workers alone share the layout's part (their batches are counted apart:
    the loader's workers are processes of their own); another batch is another part."""
    from scaletrain.comm.allreduce import AllReduce

    asked = []
    real = AllReduce.memory.__func__
    monkeypatch.setattr(AllReduce, "memory", classmethod(lambda cls, cfg, *a: asked.append(cfg) or real(cls, cfg, *a)))
    cache: dict = {}
    factory = lambda: build_model("resnet18", num_classes=10, in_channels=3, image_size=64)  # noqa: E731
    parts = [per_rank(_cfg(64, workers=w, batch_size=b, **extra), factory, (3, 64, 64), runtime=0, cache=cache)
             for w, b, extra in ((0, 1, {}), (4, 1, {}), (8, 1, {"persistent_workers": True}), (0, 2, {}))]
    assert len(asked) == 2 and parts[0] == parts[1] == parts[2] != parts[3]
