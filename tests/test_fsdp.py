"""comm/fsdp.py: FSDP2 on 2 ranks trains as one process with the same global batch, its checkpoint holds the
whole model and optimizer state, a resumed run replays bit for bit; offload is refused where it cannot run."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import EXACT, FP64, assert_same_weights, summary, weights
from scaletrain.cli import main

LENET = ["--model", "lenet5", "--dataset", "digits", "--epochs", "1", "--lr", "0.05", "--no-augment", "--seed", "3",
         *FP64]  # exact on any CPU in float64 (conftest.EXACT)
RESNET = ["--model", "resnet20", "--width", "0.5", "--dataset", "digits", "--image-size", "16", "--epochs", "2",
          "--batch-size", "16", "--optimizer", "nesterov", "--seed", "1", "--strategy", "fsdp", "--nproc", "2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ranks):
    import multirank

    base = tmp_path_factory.mktemp("fsdp")
    out = {name: base / name for name in ("one", "fsdp")}
    multirank.train(ranks, *LENET, "--nproc", "1", "--batch-size", "64", "--out", str(out["one"]))
    multirank.train(ranks, *LENET, "--strategy", "fsdp", "--nproc", "2", "--batch-size", "32", "--out", str(out["fsdp"]))
    return out


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, ranks):
    import multirank

    base = tmp_path_factory.mktemp("fsdp-resume")
    out = {name: base / name for name in ("straight", "broken")}
    multirank.train(ranks, *RESNET, "--out", str(out["straight"]), timeout=300)
    multirank.train(ranks, *RESNET, "--stop-after", "1", "--out", str(out["broken"]), timeout=300)
    multirank.train(ranks, "--resume", "--out", str(out["broken"]), timeout=300)
    return out


@pytest.mark.equivalence
def test_two_shards_follow_one_process_with_the_same_global_batch(runs):
    one, fsdp = runs["one"], runs["fsdp"]
    s = summary(fsdp)
    assert s["global_batch"] == summary(one)["global_batch"] == 64 and s["steps"] == summary(one)["steps"]
    assert s["fsdp"]["shards"] == 2 and s["fsdp"]["units"] > 2
    total = sum(v.numel() * v.element_size() for v in weights(one).values())
    assert s["fsdp"]["param_bytes_per_rank"] < 0.6 * total  # each rank holds about half the parameters
    assert s["replicas_identical"] is True  # the digest is of the whole (gathered) model on every rank
    assert_same_weights(one, fsdp)
    la = [json.loads(x)["loss"] for x in (one / "metrics-rank0.jsonl").read_text().splitlines()]
    lb = [(json.loads(a)["loss"] + json.loads(b)["loss"]) / 2 for a, b in zip(
        (fsdp / "metrics-rank0.jsonl").read_text().splitlines(), (fsdp / "metrics-rank1.jsonl").read_text().splitlines())]
    assert lb == pytest.approx(la, rel=EXACT["rtol"])
    assert s["top1"] == summary(one)["top1"]  # evaluated through the sharded model, in lockstep


def test_the_checkpoint_holds_the_whole_model_and_optimizer_state(runs):
    ckpt = torch.load(runs["fsdp"] / "checkpoint.pt", weights_only=True)
    params = dict(weights(runs["one"]))
    assert all(not hasattr(v, "to_local") for v in ckpt["model"].values())  # plain tensors, not shards
    assert {k: v.shape for k, v in ckpt["model"].items()} == {k: v.shape for k, v in params.items()}
    state = ckpt["optimizer"]["state"]
    assert set(state) == {k for k in params if "num_batches" not in k and "running" not in k}


# a second strategy's resume-exactness test (three ResNet-20 runs, ~40 s on 2 cores): make test-slow; resuming
# bit for bit stays fast in test_train_ddp (allreduce), test_pipeline, test_ps_resume and test_strategies
@pytest.mark.slow
def test_a_resumed_fsdp_run_replays_exactly(resumed):
    a = torch.load(resumed["straight"] / "checkpoint.pt", weights_only=True)
    b = torch.load(resumed["broken"] / "checkpoint.pt", weights_only=True)
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    for key, st in a["optimizer"]["state"].items():
        assert torch.equal(st["momentum_buffer"], b["optimizer"]["state"][key]["momentum_buffer"]), key
    assert summary(resumed["broken"])["status"] == "completed"


@pytest.mark.parametrize("extra, words", [
    (["--strategy", "fsdp", "--offload", "params"], "needs a CUDA device"),
    (["--offload", "activations"], "needs a CUDA device"),
    (["--offload", "params"], "--offload params needs --strategy fsdp"),
    (["--strategy", "fsdp", "--compress", "fp16"], "--compress is not supported with --strategy fsdp"),
    (["--offload", "disk"], "--offload must be one of"),
])
def test_bad_fsdp_and_offload_requests_are_one_line_and_exit_2(tmp_path, capsys, extra, words):
    code = main(["train", "--model", "lenet5", "--dataset", "digits", "--nproc", "2", "--device", "cpu", *extra,
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("was, now", [("allreduce", "fsdp"), ("fsdp", "ddp"), ("pipeline", "fsdp")])
def test_a_resume_across_optimizer_state_layouts_is_refused(tmp_path, was, now):
    from scaletrain.errors import UserError
    from scaletrain.train import checkpoint

    ckpt = {"config": {"strategy": was, "model": "lenet5"}}
    with pytest.raises(UserError) as e:
        checkpoint.check_resume(ckpt, {"strategy": now, "model": "lenet5"}, tmp_path / "checkpoint.pt", lambda d: 32)
    assert f"--strategy {was} to {now}" in str(e.value) and "keyed by parameter" in str(e.value)
    checkpoint.check_resume(ckpt, {"strategy": was, "model": "lenet5"}, tmp_path / "checkpoint.pt", lambda d: 32)
