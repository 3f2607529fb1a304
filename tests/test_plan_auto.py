"""`scaletrain train --plan auto`: the run's own request planned on this machine's calibration, the settings given
fixing their axes, the choice run; what one node's plan cannot decide refused in one line. And a plan with no
image size fixed: the largest side of each layout within its budget."""

import json

import pytest

from scaletrain.cli import main
from scaletrain.predict import calibration
from predict_fixtures import fake_calibration


@pytest.fixture
def machine_calibration(tmp_path, monkeypatch):
    """A calibration of 'this machine' in a cache of the test's own (the made-up laws of predict_fixtures)."""
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))
    return calibration.save(fake_calibration(threads=(1, 2)), calibration.cache_path())


def test_plan_auto_chooses_what_the_run_left_open_and_runs_it(machine_calibration, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--plan", "auto", "--model", "lenet5", "--dataset", "digits", "--nproc", "1",
                 "--epochs", "1", "--strategy", "allreduce", "--precision", "fp32", "--workers", "0",
                 "--compress", "none", "--checkpoint-activations", "none", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "plan auto: #1 of 5 candidates" in said  # the five batches: every other axis was given
    summary = json.loads((out / "summary.json").read_text())
    config = (out / "config.toml").read_text()
    assert summary["status"] == "completed" and summary["precision"] == "fp32"
    assert 'strategy = "allreduce"' in config and "workers = 0" in config
    assert summary["global_batch"] in (16, 32, 64, 128, 256)  # the plan's choice among the batches it searched


@pytest.mark.parametrize("flags,words", [
    (["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "29999"], ["--plan auto plans one node", "--plan DIR"]),
    (["--strategy", "ps-async"], ["ps-async", "does not search it"]),
    (["--plan-rank", "99", "--strategy", "ring", "--precision", "fp32", "--workers", "0", "--batch-size", "32",
      "--checkpoint-activations", "none"], ["--plan-rank 99", "give 1 to 1"]),
])
def test_what_plan_auto_cannot_decide_is_refused_in_one_line(machine_calibration, tmp_path, capsys, flags, words):
    assert main(["train", "--plan", "auto", "--model", "lenet5", "--dataset", "digits", "--nproc", "2", *flags,
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and all(w in err for w in words), err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # ten layouts' memory searches of ResNet-18 (9 s; each part unit-tested in test_memory_plan.py)
def test_a_plan_without_an_image_size_gives_each_layouts_largest_side(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["plan", "--model", "resnet18", "--nodes", "1", "--nproc", "4", "--hardware", "dgx-a100-80gb",
                 "--batch-size", "32", "--precision", "bf16", "--workers", "0", "--compress", "none",
                 "--checkpoint-activations", "none", "--memory-per-device", "8GiB", "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    sides = {r["layout"]: r for r in plan["largest_sides"]}
    given = sides["as given"]["largest_side"]
    assert given and given % 64 == 0 and sides["as given"]["bytes_per_rank"] <= 8 * 2**30
    # a layout that holds less per rank trains a larger side: activation checkpointing, or 4 spatial tiles
    assert sides["--checkpoint-activations blocks"]["largest_side"] > given
    assert sides["--strategy spatial --spatial 4"]["largest_side"] > given
    assert "largest image side within 8.0 GiB per rank" in capsys.readouterr().out
    assert "the largest image side of each layout" in (out / "report.html").read_text()
