"""The data-sheet basis (predict/datasheet.py): a roofline worked by hand for one convolution and for
ResNet-50, no calibration of this machine read or made, the plausibility flag, points that do not combine
skipped with their reason, and shapes traced on meta tensors at any batch and image size."""

from __future__ import annotations

import dataclasses
import json
import time
import tomllib

import pytest
import torch
from torch import nn

from scaletrain.cli import main
from scaletrain.errors import UserError
from scaletrain.perf.hardware import LAUNCH_OVERHEAD_S, load_hardware, parse_hardware
from scaletrain.predict import calibration
from scaletrain.predict.datasheet import DatasheetPredictor, op_cost
from scaletrain.predict.ops import trace_ops
from scaletrain.predict.points import plausibility
from test_perf_hardware import GOOD

NETWORK = {"intra": {k: {"alpha_s": 1e-5, "beta_s_per_byte": 1e-11} for k in ("allreduce", "ring", "ps")},
           "inter": None}


def toy(**changes):
    return dataclasses.replace(parse_hardware(tomllib.loads(GOOD), "toy.toml"), **changes)


def test_one_convolution_is_its_roofline_worked_by_hand():
    hw = toy()  # fp32 10 TFLOP/s, 1 TB/s, both at 50%; no TF32: the conv runs at fp32's peak
    conv = nn.Sequential(nn.Conv2d(64, 128, 3, padding=1, bias=False))
    (op,) = trace_ops(conv, (64, 56, 56), 32).ops
    flops = 2 * 32 * 128 * 56 * 56 * 64 * 9
    assert op.flops == flops
    x, y, w = 32 * 64 * 56 * 56, 32 * 128 * 56 * 56, 128 * 64 * 9
    cost = op_cost(op, hw, "fp32")
    fwd = max(flops / (10e12 * 0.5), (4 * (x + y) + 4 * w) / (1e12 * 0.5)) + LAUNCH_OVERHEAD_S["cuda"]
    assert cost.forward_s == pytest.approx(fwd, rel=1e-12)
    assert cost.forward_s > flops / 5e12  # compute-bound at these sizes
    # backward: input and weight gradients, twice the FLOPs, two kernels (a first layer: no input gradient)
    bwd = max(flops / 5e12, (4 * (2 * y + x) + 8 * w) / 5e11) + 2 * LAUNCH_OVERHEAD_S["cuda"]
    assert cost.backward_s == pytest.approx(bwd, rel=1e-12)
    # fp16 runs at its own peak with 2-byte activations; fp32 on a device with TF32 at TF32's peak
    a100 = load_hardware("dgx-a100-80gb")
    tf32 = op_cost(op, a100, "fp32").forward_s - LAUNCH_OVERHEAD_S["cuda"]
    e = a100.efficiency
    assert tf32 == pytest.approx(max(flops / (156e12 * e.tf32),
                                     (4 * (x + y) + 4 * w) / (2.039e12 * e.memory)), rel=1e-12)


def test_resnet50_on_a_data_sheet_is_its_ops_rooflines_and_no_faster_than_peak():
    from scaletrain.models.registry import build_model

    a100 = load_hardware("dgx-a100-80gb")
    with torch.device("meta"):
        model = build_model("resnet50", num_classes=1000, in_channels=3, image_size=224)
    w = trace_ops(model, (3, 224, 224), 256)
    fwd_flops = sum(op.flops for op in w.ops)
    assert fwd_flops / 256 == pytest.approx(8.2e9, rel=0.02)  # 4.1 GMACs per image, as published
    p = DatasheetPredictor(a100, NETWORK)
    costs = p.op_costs(w, "fp16", 1)
    step = sum(c.forward_s + c.backward_s for c in costs)
    by_hand = sum(op_cost(op, a100, "fp16").forward_s + op_cost(op, a100, "fp16").backward_s for op in w.ops)
    assert step == pytest.approx(by_hand, rel=1e-12)
    floor = 3 * fwd_flops / a100.peak_flops["fp16"]  # forward + two backward GEMMs at the full data-sheet peak
    assert 2 * floor < step < 0.5  # well above the peak's floor, and a fraction of a second (not 42 s)


def test_a_data_sheet_prediction_reads_and_makes_no_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))

    def refuse(*a, **k):
        raise AssertionError("a data-sheet prediction touched this machine's calibration")

    monkeypatch.setattr(calibration, "load", refuse)
    monkeypatch.setattr("scaletrain.predict.calibrate_cli.make_calibration", refuse)
    out = tmp_path / "hw"
    t0 = time.perf_counter()
    assert main(["predict", "--out", str(out), "--dataset", "synthetic", "--synthetic-samples", "100000",
                 "--image-size", "224", "--model", "resnet50", "--nproc", "1,8", "--batch-size", "64",
                 "--hardware", "dgx-a100-80gb"]) == 0
    assert time.perf_counter() - t0 < 120  # seconds, not a calibration's minutes (generous for a loaded CI)
    assert not (tmp_path / "cache").exists()
    p = json.loads((out / "prediction.json").read_text())
    assert p["basis"] == "datasheet" and p["calibration_device"] is None
    one, eight = p["points"]
    assert 500 < one["samples_per_s"] < 3000  # one A100 in TF32: hundreds to a few thousand images/s
    assert 0.9 < eight["efficiency"] <= 1.0  # NVLink hides DDP's all-reduce at this size
    assert all(0.01 < q["plausibility"]["fraction_of_peak"] < 1 and q["plausibility"]["flag"] is None
               for q in p["points"])


def test_a_step_that_leaves_the_device_idle_or_outruns_its_peak_is_flagged(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "tiny"
    assert main(["predict", "--out", str(out), "--model", "lenet5", "--batch-size", "8",
                 "--hardware", "dgx-a100-80gb"]) == 0
    p = json.loads((out / "prediction.json").read_text())
    flag = p["points"][0]["plausibility"]["flag"]
    assert "almost idle" in flag and any(flag in n for n in p["notes"])
    assert p["points"][0]["plausibility"]["fraction_of_peak"] < 0.01
    # a calibration-based point faster than the fastest op the calibration measured is impossible
    from scaletrain.models.registry import build_model

    w = trace_ops(build_model("lenet5", num_classes=10, in_channels=1, image_size=28), (1, 28, 28), 32)
    flops = sum(op.flops * (2 + op.needs_input_grad) for op in w.ops)
    fast = plausibility(w, {"forward": flops / 4e9, "backward": flops / 4e9}, 1e9, 10, None)
    assert fast["fraction_of_peak"] == pytest.approx(2.0) and "impossible" in fast["flag"]
    empty = plausibility(w, {"forward": 1.0, "backward": 1.0}, 1e9, 0, None)
    assert "no full step" in empty["flag"]
    big = plausibility(w, {"forward": 1.0, "backward": 1.0}, 1e9, 10, None, 3 * 2**30, 2 * 2**30)
    assert "needs 3.0 GiB, more than the device's 2.0 GiB" in big["flag"]


def test_a_point_whose_options_do_not_combine_is_skipped_with_its_reason(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "grid"
    assert main(["predict", "--out", str(out), "--model", "lenet5", "--batch-size", "32", "--nproc", "8",
                 "--strategy", "allreduce,ring,pipeline", "--compress", "none,fp16",
                 "--hardware", "dgx-a100-80gb"]) == 0
    p = json.loads((out / "prediction.json").read_text())
    predicted = {(q["config"]["strategy"], q["config"]["compress"]) for q in p["points"]}
    assert predicted == {("allreduce", "none"), ("allreduce", "fp16"), ("ring", "none")}
    reasons = {s["id"]: s["reason"] for s in p["skipped"]}
    assert "applies only with --strategy allreduce" in reasons["nproc8-strategy_ring-compress_fp16"]
    # 8 stages (a rank each) of the default 4 micro-batches: what torch's schedules, and so the launcher, refuse
    assert "fewer than the 8 stages" in reasons["nproc8-strategy_pipeline-compress_none"]
    assert len(reasons) == 3
    said = capsys.readouterr().out
    assert "skipped nproc8-strategy_ring-compress_fp16: --compress fp16" in said
    # when no point can be predicted, the first reason is the one line
    capsys.readouterr()
    assert main(["predict", "--out", str(tmp_path / "none"), "--model", "lenet5", "--nproc", "8",
                 "--strategy", "pipeline", "--microbatches", "8", "--hardware", "dgx-a100-80gb"]) == 2
    assert "more than the model's 5 blocks" in capsys.readouterr().err and not (tmp_path / "none").exists()


def test_a_pipeline_on_a_data_sheet_prices_its_blocks_by_the_roofline():
    """Each stage on its own device: the stages' forward is M micro-batches of the mean stage, M / K of the whole
    model's roofline forward at the micro-batch (no loop factors on a data sheet); the bubble and the transfers over
    the profile's link on top."""
    from scaletrain.config import TrainConfig
    from scaletrain.perf.hardware import load_hardware
    from scaletrain.predict import pipeline as PP
    from scaletrain.predict.datasheet import DatasheetPredictor
    from scaletrain.predict.node_times import node_times

    hw = load_hardware("dgx-a100-80gb")
    p = DatasheetPredictor(hw, {"intra": {}, "inter": None})
    cfg = TrainConfig.from_dict(dict(model="resnet18", strategy="pipeline", nproc=4, batch_size=64, microbatches=4,
                                     image_size=224))
    facts = {"image_size": 224, "classes": 1000, "channels": 3}
    pp = PP.pipeline_phases(p, cfg, facts, 1, (5e-6, 1 / 240e9))
    k, m = len(pp["split"]["stages"]), 4
    assert k == 4
    model, _ = PP._blocked("resnet18", 1000, 3, 224, 16, "auto", 1.0)
    times = node_times(model, (3, 224, 224), 16, None, predictor=p)
    assert pp["forward"] * k / m == pytest.approx(sum(f for f, _ in times.values()))
    assert pp["backward"] * k / m == pytest.approx(sum(b for _, b in times.values()))
    assert pp["bubble"] > 0 and pp["p2p"] > 0


def test_shapes_come_from_meta_tensors_at_any_batch_and_image_size(tmp_path, monkeypatch):
    """ResNet-18 at 4096 px and batch 64: 0.7 TB of activations were it run, traced in seconds here; and a
    prediction at that size says the rank would not fit its device."""
    from scaletrain.predict.points import _cached_workload

    w = _cached_workload("resnet18", 10, 3, 4096, 64, "auto", 1.0)
    assert w.batch_size == 64 and w.traced_by == "fx"
    acts = sum(op.out_bytes for op in w.ops if op.saves_activation)
    assert acts > 5e11  # the trace saw the real sizes without holding them
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "big"
    assert main(["predict", "--out", str(out), "--model", "resnet18", "--dataset", "synthetic", "--image-size",
                 "4096", "--batch-size", "64", "--hardware", "dgx-a100-80gb"]) == 0
    flag = json.loads((out / "prediction.json").read_text())["points"][0]["plausibility"]["flag"]
    assert "more than the device's 74.5 GiB" in flag


def test_the_profile_loader_rate_prices_the_input_pipeline():
    hw = toy(loader_samples_per_s_per_core=500.0)
    p = DatasheetPredictor(hw, NETWORK)
    assert p.loader_sample_s("imagefolder:/x", 224, None) == pytest.approx(1 / 500)
    assert p.loader_sample_s("synthetic", 224, None) == 0.0
    bare = DatasheetPredictor(toy(), NETWORK)
    assert bare.loader_sample_s("imagefolder:/x", 224, None) == 0.0 and "not priced" in bare.notes[0]
    with pytest.raises(UserError, match="loader_samples_per_s_per_core"):
        parse_hardware({**tomllib.loads(GOOD), "host": {"loader_samples_per_s_per_core": -1}}, "toy.toml")


def test_one_cores_loader_rate_is_measured_in_seconds_and_prices_a_data_sheet(tmp_path, monkeypatch, capsys):
    from scaletrain.data import write_imagefolder

    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "jpegs"
    write_imagefolder(source="digits", out=folder, image_size=32, copies=1, seed=0, quality=90)
    rate_file = tmp_path / "loader.json"
    assert main(["calibrate", "--only", "loader", "--dataset", f"imagefolder:{folder}", "--image-size", "32",
                 "--out", str(rate_file)]) == 0
    rate = json.loads(rate_file.read_text())
    assert rate["kind"] == "loader-rate" and rate["image_size"] == 32 and rate["samples_per_s_per_core"] > 10
    assert not (tmp_path / "cache").exists()  # no calibration of this machine
    flags = ["--model", "lenet5", "--image-size", "32", "--dataset", f"imagefolder:{folder}", "--batch-size", "64",
             "--nproc", "8", "--hardware", "dgx-a100-80gb"]
    out = tmp_path / "p"
    assert main(["predict", "--out", str(out), *flags, "--workers", "0,1", "--loader", str(rate_file)]) == 0
    p = json.loads((out / "prediction.json").read_text())
    none, one = p["points"]
    assert none["phases_s"]["data_wait"] == pytest.approx(64 / rate["samples_per_s_per_core"])
    assert none["limit"] == "input" and one["phases_s"]["data_wait"] < none["phases_s"]["data_wait"]
    assert "measured on" in p["basis_note"]
    capsys.readouterr()
    # --loader only with a data sheet; a file that is not a loader rate is named
    assert main(["predict", "--out", str(tmp_path / "q"), "--model", "lenet5", "--loader", str(rate_file)]) == 2
    assert "--loader" in capsys.readouterr().err
    assert main(["predict", "--out", str(tmp_path / "q"), *flags, "--loader", str(folder)]) == 2
    assert "not a readable JSON file" in capsys.readouterr().err and not (tmp_path / "q").exists()
    assert main(["calibrate", "--only", "loader", "--out", str(tmp_path / "x.json")]) == 2
    assert "give --dataset" in capsys.readouterr().err


def test_testbed_predictions_take_the_hosts_cores_and_link_from_the_testbed(tmp_path, monkeypatch, capsys):
    """Two hosts on a 2-core machine get one pinned core each (as `testbed run` shares them), the testbed's
    rate, and twice its delay one way; a third host shares the cores."""
    from predict_fixtures import fake_calibration
    from scaletrain.testbed.plan import Testbed

    cal = calibration.save(fake_calibration(threads=(1, 2)), tmp_path / "cal.json")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr("scaletrain.testbed.net.current", lambda: Testbed(2, "100mbit", "0.5ms"))
    out = tmp_path / "tb"
    assert main(["predict", "--calibration", str(cal), "--model", "lenet5", "--batch-size", "32", "--testbed",
                 "--out", str(out)]) == 0
    p = json.loads((out / "prediction.json").read_text())
    (point,) = p["points"]
    assert point["config"]["nnodes"] == 2 and point["config"]["threads"] == 1 and p["cores_per_node"] == 1
    assert p["shared_cores"] is None and p["network"]["inter"]["beta_s_per_byte"] == pytest.approx(8 / 100e6)
    assert p["network"]["inter"]["alpha_s"] == pytest.approx(1e-3)
    assert "1 core per host (cpus 0 / 1)" in capsys.readouterr().out
    monkeypatch.setattr("scaletrain.testbed.net.current", lambda: Testbed(3, "100mbit", "0ms"))
    out3 = tmp_path / "tb3"
    assert main(["predict", "--calibration", str(cal), "--model", "lenet5", "--batch-size", "32", "--testbed",
                 "--out", str(out3)]) == 0
    p3 = json.loads((out3 / "prediction.json").read_text())
    # 3 hosts of one thread on 2 cores: two share one core, the third has one alone (5/3 on average)
    assert p3["shared_cores"] == 2 and p3["points"][0]["core_sharing_stretch"] == pytest.approx(5 / 3)
    capsys.readouterr()
    assert main(["predict", "--calibration", str(cal), "--model", "lenet5", "--testbed", "--nnodes", "4",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "has 3 hosts" in capsys.readouterr().err
    assert main(["predict", "--calibration", str(cal), "--model", "lenet5", "--testbed", "--link", "1gbit",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "drop --link" in capsys.readouterr().err
    monkeypatch.setattr("scaletrain.testbed.net.current", lambda: None)
    assert main(["predict", "--calibration", str(cal), "--model", "lenet5", "--testbed",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "no testbed is up" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_without_a_calibration_predict_says_how_much_less_right_a_quick_one_is(tmp_path, monkeypatch, capsys):
    from predict_fixtures import fake_calibration

    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))
    made = []

    def quick(path, quick):
        made.append(quick)
        calibration.save(fake_calibration(), path)

    monkeypatch.setattr("scaletrain.predict.calibrate_cli.make_calibration", quick)
    assert main(["predict", "--model", "lenet5", "--out", str(tmp_path / "p")]) == 0
    said = capsys.readouterr().out
    assert made == [True] and said.index("measuring a quick one") < said.index("predicted scaling")
    assert "a quick calibration predicted step times with a median error of 29%" in said
    assert "run `scaletrain calibrate` once for a full one" in said


def test_fsdp_on_a_data_sheet_names_the_host_cost_it_does_not_price(tmp_path, monkeypatch):
    """One H200 ran FSDP at one rank up to 2.4x slower than predicted: 0.8-2.3 ms of host work per unit and
    step, which two points of one machine cannot price; the prediction says so, with the model's units."""
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "fsdp"
    assert main(["predict", "--out", str(out), "--model", "resnet20", "--batch-size", "64", "--strategy",
                 "allreduce,fsdp", "--nproc", "2", "--hardware", "dgx-a100-80gb"]) == 0
    notes = json.loads((out / "prediction.json").read_text())["notes"]
    (note,) = [n for n in notes if "fsdp" in n]
    assert "host work per unit" in note and "resnet20's" in note and "not priced" in note


def test_fp16_compression_prices_its_two_casts_on_the_buckets_path():
    from types import SimpleNamespace

    from scaletrain.predict.pricing import codec_seconds, reduce_seconds

    a100 = load_hardware("dgx-a100-80gb")
    p = DatasheetPredictor(a100, NETWORK)
    numel = 25 * 2**20 // 4  # DDP's default 25 MB bucket
    casts = 12 * numel / (a100.memory_bandwidth_bytes_per_s * a100.efficiency.memory) + 2 * LAUNCH_OVERHEAD_S["cuda"]
    assert p.codec_s(numel, 1) == pytest.approx(casts, rel=1e-12)  # 4 read + 2 written, then back: 12 bytes each
    setting = SimpleNamespace(compress=("fp16", None), trainers=8, rank_threads=1)
    codec = codec_seconds(SimpleNamespace(setting=setting, predictor=p))
    plain, cast = reduce_seconds(setting, (1e-5, 1e-11)), reduce_seconds(setting, (1e-5, 1e-11), codec)
    assert cast(4 * numel) - plain(4 * numel) == pytest.approx(casts, rel=1e-12)
    for other in (None, ("topk", 0.01)):  # nothing cast, or a compressor whose own work is not priced
        assert codec_seconds(SimpleNamespace(setting=SimpleNamespace(compress=other), predictor=p)) is None


@pytest.mark.parametrize("strategy", [{"strategy": "allreduce"},
                                      {"strategy": "pipeline", "microbatches": 8, "checkpoint_activations": "auto"}])
def test_a_point_priced_after_one_with_other_workers_is_priced_as_alone(strategy):
    """What loader workers change nothing of is kept per basis for the configuration without them (a plan's
    candidates that differ in workers alone): a point priced after its twin is the point priced on a fresh basis."""
    from scaletrain.config.train import TrainConfig
    from scaletrain.predict.points import predict_config

    a100 = load_hardware("dgx-a100-80gb")
    base = {"model": "resnet50", "image_size": 224, "dataset": "synthetic", "synthetic_samples": 4096, "nproc": 8,
            "batch_size": 64, "precision": "bf16", **strategy}
    shared = DatasheetPredictor(a100, NETWORK)
    twin = predict_config(shared, TrainConfig.from_dict({**base, "workers": 0}))
    kept = predict_config(shared, TrainConfig.from_dict({**base, "workers": 4}))
    alone = predict_config(DatasheetPredictor(a100, NETWORK), TrainConfig.from_dict({**base, "workers": 4}))
    assert kept["setting"].workers == 4 and twin["setting"].workers == 0
    for key in ("phases_s", "step_time_s", "epoch_time_s", "peak_memory_bytes", "memory_bytes", "comm", "limit",
                "plausibility", "ops", "notes"):
        assert kept[key] == alone[key], key
