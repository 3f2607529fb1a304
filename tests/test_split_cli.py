"""`scaletrain split` end to end, and what training reads back (split/cli.py, plan.py, costs.py, view.py)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from scaletrain.cli import main
from scaletrain.errors import UserError
from scaletrain.models import build_model
from scaletrain.predict import calibration
from scaletrain.split import costs as costs_module
from scaletrain.predict.cli import parse_rate
from scaletrain.units import size_flag
from scaletrain.split.partition import BlockCost, evaluate
from scaletrain.split.plan import choose, load_split, micro_batch
from scaletrain.split.stages import blocked

from predict_fixtures import fake_calibration

SIZES = {"resnet20": 8, "vgg11": 32}


def fake_as_trained(module, x, **kw):
    """A stand-in clock for the CLI tests (test_measured_costs_... times for real): 0.1 ms + 1 ns per weight."""
    forward = 1e-4 + 1e-9 * sum(p.numel() for p in module.parameters())
    return forward, 2 * forward


@pytest.fixture
def no_cache(tmp_path, monkeypatch):
    """No calibration of this machine: split falls back to measuring, here with a stand-in clock (a loaded
    2-core machine stretches real timing tenfold)."""
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(costs_module, "_as_trained", fake_as_trained)


@pytest.fixture(scope="module")
def cal_file(tmp_path_factory):
    return calibration.save(fake_calibration(), tmp_path_factory.mktemp("cal") / "cal.json")


def split(model, out, *extra):
    return main(["split", "--model", model, "--stages", "2", "--image-size", str(SIZES[model]),
                 "--batch-size", "8", "--microbatches", "2", "--out", str(out), *extra])


def read(out):
    return json.loads((out / "split.json").read_text())


def blocks_of(model):
    m = build_model(model, num_classes=10, in_channels=3, image_size=SIZES[model])
    return m, blocked(m, (3, SIZES[model], SIZES[model]))


def test_measured_without_calibration(tmp_path, no_cache, capsys):
    assert split("resnet20", tmp_path / "r") == 0
    shown = capsys.readouterr().out
    assert "no calibration of this machine" in shown and "the default" in shown  # the costs and the link said
    # output that is not a terminal (a SLURM log, nohup; captured here) is told what the seconds (minutes at
    # large images) of measuring are: a line as it starts, as blocks are timed, as it ends
    what = "measuring 11 blocks' costs (3 rounds, micro-batch 4)"
    lines = [line for line in shown.splitlines() if line.startswith(what)]
    assert lines[0] == f"{what} ..." and lines[1].startswith(f"{what}: 1/33 (") and "ETA" in lines[1]
    assert lines[-1].startswith(f"{what}: done in ")
    r = read(tmp_path / "r")
    assert r["costs_source"] == "measured" and r["link_bytes_per_s"] == 10e9 / 8
    assert (r["model"], r["stages"], r["microbatches"], r["micro_batch"], r["schedule"]) == ("resnet20", 2, 2, 4,
                                                                                            "1f1b")
    assert r["input_shape"] == [3, 8, 8] and r["batch_size"] == 8 and r["memory_per_stage"] is None
    assert len(r["blocks"]) == 11 and set(r["baselines"]) == {"uniform", "params", "time"}
    chosen = r["chosen"]
    assert [len(s["blocks"]) for s in chosen["stages"]] == chosen["sizes"] and sum(chosen["sizes"]) == 11
    assert all(s["forward_s"] > 0 and s["backward_s"] == pytest.approx(2 * s["forward_s"]) for s in chosen["stages"])
    assert r["baselines"]["uniform"]["sizes"] == [6, 5] and r["baselines"]["uniform"]["speedup_over_uniform"] == 1
    for p in (chosen, *r["baselines"].values()):  # the optimum is no slower than any baseline
        assert chosen["step_s"] <= p["step_s"] + 1e-12 and p["samples_per_s"] == pytest.approx(8 / p["step_s"])


def test_predicted_from_a_calibration(tmp_path, cal_file, capsys):
    assert split("vgg11", tmp_path / "v", "--calibration", str(cal_file), "--schedule", "gpipe",
                 "--optimizer", "adamw", "--memory-per-stage", "1GiB") == 0
    assert "predicted from" in capsys.readouterr().out
    r = read(tmp_path / "v")
    assert r["costs_source"] == "predicted" and r["memory_per_stage"] == 2**30
    assert r["link_bytes_per_s"] == pytest.approx(1e9)  # the calibration's beta: 1 ns per byte
    first = r["chosen"]["stages"][0]
    assert first["in_flight"] == 2 and first["memory"]["optimizer"] == 2 * first["memory"]["weights"]  # adamw
    assert r["chosen"]["fits"] and r["chosen"]["peak_memory_bytes"] <= 2**30
    assert [c["name"] for c in r["block_costs"]] == r["blocks"]


def test_offload_lowers_the_smallest_limit_and_prices_copies(tmp_path, no_cache, capsys):
    base = ["--schedule", "gpipe", "--link", "10Gbit/s"]
    smallest = {}
    for offload in ([], ["--offload", "100Gbit/s"]):  # the smallest limits without and with offload
        assert split("vgg11", tmp_path / "x", *base, "--memory-per-stage", "1KiB", *offload) == 2
        smallest[bool(offload)] = int(capsys.readouterr().err.split("feasible split is ")[1].split(" bytes")[0])
    assert smallest[True] < smallest[False]
    assert split("vgg11", tmp_path / "off", *base, "--memory-per-stage", str(smallest[True]), "--offload",
                 "100Gbit/s") == 0
    r = read(tmp_path / "off")
    assert any(s["offload"] != "none" for s in r["chosen"]["stages"]) and r["chosen"]["fits"]
    assert any("offload copies priced at 12.5 GB/s" in n for n in r["notes"])


def test_precision_halves_activation_bytes(tmp_path, no_cache):
    assert split("resnet20", tmp_path / "f") == 0 and split("resnet20", tmp_path / "h", "--precision", "bf16") == 0
    full, half = read(tmp_path / "f")["block_costs"], read(tmp_path / "h")["block_costs"]
    assert [2 * h["saved_bytes"] for h in half] == [f["saved_bytes"] for f in full]
    assert [h["param_bytes"] for h in half] == [f["param_bytes"] for f in full]  # weights stay fp32


@pytest.mark.parametrize("argv, expect", [
    (["--model", "resnet21", "--stages", "2"], "unknown model"),
    (["--model", "resnet20", "--stages", "0"], "--stages 0"),
    (["--model", "resnet20", "--stages", "12"], "11 blocks (10 cut points)"),
    (["--model", "resnet20", "--stages", "2", "--microbatches", "3"], "does not divide --batch-size 32"),
    (["--model", "resnet20", "--stages", "2", "--memory-per-stage", "lots"], "--memory-per-stage 'lots'"),
    (["--model", "resnet20", "--stages", "2", "--link", "fast"], "--link 'fast'"),
    (["--model", "resnet20", "--stages", "2", "--costs", "predicted"], "needs a calibration"),
    (["--model", "resnet20", "--stages", "2", "--calibration", "/nonexistent/cal.json"], "does not exist"),
])
def test_bad_input_is_one_line_exit_2(argv, expect, tmp_path, no_cache, capsys):
    assert main(["split", *argv, "--image-size", "8", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert expect in err and err.count("\n") == 1, err


def test_infeasible_memory_names_the_smallest_limit(tmp_path, no_cache, capsys):
    assert split("resnet20", tmp_path / "x", "--memory-per-stage", "1KiB") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "smallest limit with a feasible split is" in err
    smallest = int(err.split("feasible split is ")[1].split(" bytes")[0])
    assert split("resnet20", tmp_path / "y", "--memory-per-stage", str(smallest)) == 0  # the limit named is enough
    assert read(tmp_path / "y")["chosen"]["peak_memory_bytes"] <= smallest


def test_load_split_reads_its_own_and_refuses_others(tmp_path, no_cache):
    assert split("resnet20", tmp_path / "r") == 0
    path = tmp_path / "r" / "split.json"
    _, r20 = blocks_of("resnet20")
    _, v11 = blocks_of("vgg11")
    bounds = [tuple(b) for b in read(tmp_path / "r")["chosen"]["bounds"]]
    assert load_split(path, r20, 2, "resnet20") == bounds == load_split(tmp_path / "r", r20, 2)
    with pytest.raises(UserError, match="made for model resnet20, not vgg11"):
        load_split(path, v11, 2, "vgg11")
    with pytest.raises(UserError, match="blocks that are not this model's"):
        load_split(path, v11, 2)
    with pytest.raises(UserError, match="into 2 stages, not 3"):
        load_split(path, r20, 3, "resnet20")
    with pytest.raises(UserError, match="does not exist"):
        load_split(tmp_path / "none.json", r20, 2)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="is not a split.json"):
        load_split(tmp_path / "bad.json", r20, 2)


def test_choose_for_training(tmp_path):
    model, b = blocks_of("resnet20")
    costs = [BlockCost(n, 1.0 + i, 1.0, 100, 10, 10) for i, n in enumerate(b.names)]
    kw = dict(stages=2, microbatches=4, schedule="1f1b", batch_size=16, costs=costs)
    auto = choose("auto", b, model, (3, 8, 8), **kw)
    # forward-heavy blocks: the played 1F1B step prefers 8 | 3 blocks (36+8 | 30+3 s) to the least bottleneck's
    # 7 | 4 (35 | 38+4 s)
    assert auto.method == "auto" and auto.bounds == [(0, 8), (8, 11)] and "block costs given" in auto.notes
    assert auto.step_s < evaluate(costs, [(0, 7), (7, 11)], microbatches=4, schedule="1f1b").step_s
    assert choose("uniform", b, model, (3, 8, 8), **kw).bounds == [(0, 6), (6, 11)]
    assert choose("params", b, model, (3, 8, 8), **kw).method == "params"
    with pytest.raises(UserError, match="does not exist"):
        choose(str(tmp_path / "missing.json"), b, model, (3, 8, 8), **kw)
    with pytest.raises(UserError, match="does not divide"):
        choose("auto", b, model, (3, 8, 8), **{**kw, "batch_size": 10})


def test_measured_costs_leave_the_model_untouched(monkeypatch):
    monkeypatch.setattr(costs_module, "ROUNDS", 1)
    model, b = blocks_of("resnet20")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    costs = costs_module.block_costs(b, model, (3, 8, 8), 4, source="measured")
    assert all(c.forward_s > 0 for c in costs) and costs[0].saved_bytes == 4 * b.blocks[0].saved_bytes
    assert all((before[k] == v).all() for k, v in model.state_dict().items())  # BatchNorm statistics too


def test_a_block_is_timed_as_a_stage_runs_it():
    """Forward then one backward that frees the graph, in-place activations kept in place (the leaf input would
    refuse a second backward or an in-place op were it timed the per-op way), no gradient left behind."""
    block = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True))
    x = torch.randn(2, 4, 8, 8)
    for input_grad in (False, True):
        f, b = costs_module._as_trained(block, x, precision="fp32", input_grad=input_grad,
                                        device=torch.device("cpu"), repeats=3, min_s=0)
        assert f > 0 and b > 0
        assert block[2].inplace and all(p.grad is None for p in block.parameters()) and x.grad is None


def test_host_copy_rate_is_measured_and_said():
    rate, how = costs_module.host_copy_rate(4 << 20)
    assert rate > 1e6 and ("host memory" in how or "pinned" in how)


def test_sizes_and_rates():
    flag = "--memory-per-stage"
    assert size_flag("512MiB", flag) == 512 * 2**20 and size_flag("2GiB", flag) == 2 * 2**30
    assert size_flag("1.5G", flag) == 3 * 2**29 and size_flag("2GB", flag) == 2 * 10**9 and size_flag("1000", flag) == 1000
    assert parse_rate("10Gbit/s") == parse_rate("10gbit") == 10e9 / 8
    for bad in ("", "-1MiB", "12 parsecs", "0"):
        with pytest.raises(UserError, match="--memory-per-stage .*: give a positive size such as 512MiB"):
            size_flag(bad, flag)
    assert micro_batch(32, 4) == 8


def test_block_shapes_from_a_meta_copy_are_the_forwards_and_its_stages_run_the_models_layers():
    model = build_model("resnet20", num_classes=10, in_channels=3, image_size=8)
    real, meta = blocked(model, (3, 8, 8), 2), blocked(model, (3, 8, 8), 2, meta=True)
    assert [(b.name, b.out_shape, b.flops) for b in real.blocks] == [(b.name, b.out_shape, b.flops) for b in meta.blocks]
    from scaletrain.split.stages import stage_module

    stage = stage_module(meta, 0, 3)
    assert stage.get_submodule("stem.0") is model.get_submodule("stem.0")  # the model's weights, not the copy's
    x = torch.randn(2, 3, 8, 8)
    model.eval()
    torch.testing.assert_close(stage(x), stage_module(real, 0, 3)(x), rtol=0, atol=0)


def test_blocks_timed_for_tiles_see_a_tile_before_the_gather_and_the_whole_image_after(monkeypatch):
    seen = []

    def record(module, x, **kw):
        seen.append(tuple(x.shape))
        return 1e-4, 2e-4

    monkeypatch.setattr(costs_module, "_as_trained", record)
    model = build_model("resnet20", num_classes=10, in_channels=3, image_size=16)
    graph = blocked(model, (3, 16, 16), 1, meta=True)
    costs_module.block_costs(graph, model, (3, 16, 16), 1, source="measured", rounds=1, tiles=(1, 2, 4))
    whole = [(1, 3, 16, 16)] + [tuple(b.out_shape) for b in graph.blocks[:-1]]
    tile = lambda s: (*s[:3], s[3] // 2)  # noqa: E731
    assert seen == [tile(s) for s in whole[:4]] + whole[4:]


def test_a_model_the_meta_device_cannot_run_falls_back_to_its_blocks_bytes_and_says_so(tmp_path, no_cache,
                                                                                        monkeypatch, capsys):
    """The stage memory is the one memory model's (comm/pipeline/memory.py) when the model runs on the meta device;
    otherwise the blocks' bytes from a forward here stand in, and the notes say so."""
    assert split("resnet20", tmp_path / "meta") == 0
    walked = read(tmp_path / "meta")
    assert set(walked["chosen"]["stages"][0]["memory"]) == {"weights", "gradients", "optimizer", "activations",
                                                             "working"}
    assert not any("blocks' bytes" in n for n in walked["notes"])
    monkeypatch.setattr("scaletrain.perf.footprint.model_memory", lambda *a, **k: None)
    assert split("resnet20", tmp_path / "bytes") == 0
    fallback = read(tmp_path / "bytes")
    assert any("blocks' bytes" in n for n in fallback["notes"]) and fallback["chosen"]["peak_memory_bytes"] > 0
    assert fallback["chosen"]["peak_memory_bytes"] != walked["chosen"]["peak_memory_bytes"]
