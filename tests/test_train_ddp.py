"""What data parallelism promises: 2 ranks equal 1 rank with the same global batch, the replicas stay
bit-identical, an interrupted run resumes bit for bit. Each is checked with the ranks in-process
(train/worker.run on the pool's processes: the `launch` fixture) and through the real CLI and elastic agent
(slow)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import EXACT, FP64, assert_ok, assert_same_weights, scaletrain, summary, weights
from scaletrain.data import build_datasets, collate
from scaletrain.train.evaluate import evaluate
from scaletrain.models import build_model
from scaletrain.perf.precision import made_in

# LeNet-5 has no BatchNorm: BN normalises with per-rank batch statistics, so only BN-free models can
# equal a single process with the global batch exactly (SyncBatchNorm has no CPU kernel in PyTorch). In float64,
# where the equality is exact on any CPU (conftest.EXACT).
COMMON = ["--model", "lenet5", "--dataset", "digits", "--epochs", "1", "--lr", "0.05", "--no-augment",
          "--no-progress", "--seed", "3", *FP64]


@pytest.fixture(scope="module")
def one_and_two_ranks(tmp_path_factory, launch):
    base = tmp_path_factory.mktemp("ddp")
    one, two = base / "one", base / "two"
    launch(*COMMON, "--nproc", "1", "--batch-size", "64", "--out", str(one))
    launch(*COMMON, "--nproc", "2", "--batch-size", "32", "--out", str(two))
    return one, two


@pytest.fixture(scope="module")
def off_by_a_millionth(tmp_path_factory, launch):
    """The control: one rank again, its learning rate (so every update) larger by one part in a million."""
    out = tmp_path_factory.mktemp("ddp-control") / "one"
    launch(*COMMON, "--nproc", "1", "--batch-size", "64", "--lr", str(0.05 * (1 + 1e-6)), "--out", str(out))
    return out


@pytest.mark.equivalence
def test_two_ranks_equal_one_rank_with_the_same_global_batch(one_and_two_ranks):
    one, two = one_and_two_ranks
    s1, s2 = summary(one), summary(two)
    assert (s1["world_size"], s2["world_size"]) == (1, 2)
    assert s1["global_batch"] == s2["global_batch"] == 64
    assert s1["steps"] == s2["steps"] > 0
    # only the order of float additions differs (all-reduce vs one big batch)
    assert_same_weights(one, two)
    start = build_reference()
    moved = sum(float((w - start[name]).abs().max()) for name, w in weights(one).items())
    assert moved > 0.01, "training did not change the weights, so the comparison proves nothing"
    # and the trajectory, not only the end point: per-step losses agree too
    assert _losses(one) == pytest.approx(_mean_losses(two), rel=EXACT["rtol"])


@pytest.mark.equivalence
def test_the_comparison_catches_an_update_off_by_one_part_in_a_million(one_and_two_ranks, off_by_a_millionth):
    with pytest.raises(AssertionError):
        assert_same_weights(one_and_two_ranks[0], off_by_a_millionth)


def _losses(run) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run / "metrics-rank0.jsonl").read_text().splitlines())]


def _mean_losses(run) -> list[float]:
    """Each step's loss over the global batch: the mean of the two ranks' halves."""
    return [(json.loads(a)["loss"] + json.loads(b)["loss"]) / 2 for a, b in zip(
        (run / "metrics-rank0.jsonl").read_text().splitlines(), (run / "metrics-rank1.jsonl").read_text().splitlines())]


def build_reference() -> dict[str, torch.Tensor]:
    torch.manual_seed(3)  # the same seed the runs start from: their initial weights, made in float64 as theirs
    with made_in("fp64"):
        return build_model("lenet5", num_classes=10, in_channels=1, image_size=32).state_dict()


def test_parameters_are_bit_identical_across_ranks(one_and_two_ranks):
    s = summary(one_and_two_ranks[1])
    assert len(s["param_digests"]) == 2
    assert s["replicas_identical"] is True
    assert s["param_digests"][0] == s["param_digests"][1]


def test_run_directory_is_complete(one_and_two_ranks):
    two = one_and_two_ranks[1]
    names = {p.name for p in two.iterdir()}
    assert {"config.toml", "checkpoint.pt", "summary.json", "epochs.jsonl",
            "metrics-rank0.jsonl", "metrics-rank1.jsonl"} <= names
    s = summary(two)
    assert s["status"] == "completed" and s["epochs"] == 1 and len(s["epoch_times_s"]) == 1
    assert 0 <= s["top1"] <= s["top5"] <= 1 and s["best_top1"] >= s["top1"]
    assert s["samples_per_s"] > 0 and s["backend"] == "gloo" and s["device"] == "cpu"
    assert s["effective_lr"] == pytest.approx(0.05)
    steps = [json.loads(line) for line in (two / "metrics-rank1.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == list(range(s["steps"]))
    assert {"step", "epoch", "loss", "step_time_s", "lr", "samples"} <= steps[0].keys()


RESUMED = ["--model", "resnet20", "--width", "0.5", "--dataset", "digits", "--image-size", "16", "--epochs", "2",
           "--batch-size", "32", "--nproc", "2", "--warmup-epochs", "1", "--scale-lr", "--optimizer", "nesterov",
           "--no-progress", "--seed", "1"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, launch):
    """ResNet-20 (BatchNorm, augmentation on: RNG state matters) on 2 ranks, without a break."""
    run = tmp_path_factory.mktemp("resume") / "straight"
    launch(*RESUMED, "--out", str(run))
    return run


@pytest.fixture(scope="module")
def resumed_and_straight(tmp_path_factory, launch, straight):
    """The same with a break after its first epoch, resumed."""
    broken = tmp_path_factory.mktemp("resume") / "broken"
    launch(*RESUMED, "--stop-after", "1", "--out", str(broken))
    assert summary(broken)["status"] == "stopped" and summary(broken)["epochs"] == 1
    # the resumed invocation names only the run directory: its config comes from config.toml
    launch("--resume", "--out", str(broken))
    return straight, broken


@pytest.mark.slow  # a second resume of DDP: the fast suite's is test_recovery's preempted run resumed bitwise
def test_interrupt_and_resume_equals_an_uninterrupted_run(resumed_and_straight):
    straight, broken = resumed_and_straight
    a = torch.load(straight / "checkpoint.pt", weights_only=True)
    b = torch.load(broken / "checkpoint.pt", weights_only=True)
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    for key, state in a["optimizer"]["state"].items():
        assert torch.equal(state["momentum_buffer"], b["optimizer"]["state"][key]["momentum_buffer"])
    sa, sb = summary(straight), summary(broken)
    assert sb["status"] == "completed" and sb["epochs"] == 2 and len(sb["epoch_times_s"]) == 2
    assert sa["top1"] == sb["top1"] and sa["steps"] == sb["steps"]
    # the resumed run's records hold each step exactly once
    steps = [json.loads(line)["step"] for line in (broken / "metrics-rank1.jsonl").read_text().splitlines()]
    assert steps == list(range(sb["steps"]))


def test_distributed_evaluation_equals_single_process(straight):
    """The 2-rank sharded evaluation in the summary equals evaluating the saved weights in one process."""
    run = straight
    s = summary(run)
    data = build_datasets("digits", image_size=16, augment=False)
    model = build_model("resnet20", num_classes=10, in_channels=1, image_size=16, width=0.5)
    model.load_state_dict(weights(run))
    loader = DataLoader(data.val, batch_size=100, collate_fn=collate)
    result = evaluate(model, loader, torch.device("cpu"), None, 10)
    assert result.samples == 360
    assert round(result.top1 * 360) == round(s["top1"] * 360)
    assert round(result.top5 * 360) == round(s["top5"] * 360)


@pytest.mark.slow  # torchrun and two workers: make test-slow
def test_the_same_command_joins_an_existing_torchrun_launch(tmp_path):
    out = tmp_path / "joined"
    proc = scaletrain("--nproc-per-node", "2", "--standalone", "-m", "scaletrain", "train", "--model", "mlp",
                      "--epochs", "1", "--batch-size", "64", "--no-progress", "--out", str(out),
                      module="torch.distributed.run")
    assert_ok(proc)
    s = summary(out)
    assert s["world_size"] == 2 and s["status"] == "completed" and s["replicas_identical"]
    assert (out / "metrics-rank1.jsonl").exists()
