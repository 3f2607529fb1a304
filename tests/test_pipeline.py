"""comm/pipeline/strategy.py: a K-stage pipeline (torch.distributed.pipelining) trains the same model as one process
with the same global batch, each rank holding its stage alone; BatchNorm per micro-batch equals an eager micro-batch loop; hybrid replicas x
stages equals it too; a resumed pipeline run replays bit for bit; bad requests are refused before launch."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from conftest import EXACT, FP64, assert_same_weights, summary, weights
from scaletrain.cli import main
from scaletrain.config import build_config
from scaletrain.data import collate
from scaletrain.models import build_model
from scaletrain.perf.precision import made_in
from scaletrain.train.build import build_data_and_model
from scaletrain.train.optim import build_optimizer, build_scheduler

# LeNet-5 has no BatchNorm: a pipeline over micro-batches then computes exactly the full batch's gradient
# (in float64, exactly on any CPU: conftest.EXACT)
LENET = ["--model", "lenet5", "--dataset", "digits", "--epochs", "1", "--lr", "0.2", "--no-augment",
         "--seed", "3", *FP64]


def _losses(run, rank=0):
    return [json.loads(line)["loss"] for line in (run / f"metrics-rank{rank}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def lenet_runs(tmp_path_factory, ranks):
    """The one-process run, and each schedule's 2-stage run when a test first asks for it (GPipe's only under
    `slow`: the fast suite trains 1F1B's)."""
    import multirank

    base = tmp_path_factory.mktemp("pipeline")
    multirank.train(ranks, *LENET, "--nproc", "1", "--batch-size", "64", "--out", str(base / "one"))

    class Runs(dict):
        def __missing__(self, schedule: str):
            multirank.train(ranks, *LENET, "--strategy", "pipeline", "--nproc", "2", "--batch-size", "64",
                            "--microbatches", "4", "--pipeline-schedule", schedule, "--split", "uniform",
                            "--out", str(base / schedule))
            self[schedule] = base / schedule
            return self[schedule]

    return Runs(one=base / "one")


@pytest.fixture(scope="module")
def hybrid_run(tmp_path_factory, ranks):
    """2 replicas x 2 stages on 4 ranks (only its slow test asks for it)."""
    import multirank

    run = tmp_path_factory.mktemp("pipeline-hybrid") / "hybrid"
    multirank.train(ranks, *LENET, "--strategy", "pipeline", "--nproc", "2x2", "--batch-size", "32",
                    "--microbatches", "4", "--split", "uniform", "--out", str(run), timeout=300)
    return run


@pytest.mark.equivalence
@pytest.mark.parametrize("schedule", ["1f1b", pytest.param("gpipe", marks=pytest.mark.slow)])
def test_two_stages_follow_one_process_with_the_same_global_batch(lenet_runs, schedule):
    one, pipe = lenet_runs["one"], lenet_runs[schedule]
    s1, s2 = summary(one), summary(pipe)
    assert s2["world_size"] == 2 and s1["global_batch"] == s2["global_batch"] == 64
    assert s1["steps"] == s2["steps"] > 0
    assert s2["pipeline"]["stages"] == 2 and s2["pipeline"]["schedule"] == schedule
    # a split given (uniform) is not timed: nothing to measure before the first step
    assert s2["pipeline"]["split_costs"] is None and s2["pipeline"]["predicted_step_s"] is None
    assert s2["replicas_identical"] is True  # the pipeline's whole model, assembled on stage 0, on every rank
    assert_same_weights(one, pipe)
    # each rank held its stage alone: its parameters, their gradients and momentum (no more)
    held, whole = s2["pipeline"]["param_bytes_per_rank"], s2["pipeline"]["model_param_bytes"]
    assert len(held) == 2 and all(0 < h < whole for h in held) and sum(held) == whole
    assert s2["pipeline"]["state_bytes_per_rank"] == [3 * h for h in held]
    # the trajectory: the loss every step (the last stage's, broadcast to rank 0) agrees
    l1, l2 = _losses(one), _losses(pipe)
    assert len(l1) == len(l2) and l2 == pytest.approx(l1, rel=EXACT["rtol"])
    assert l1[-1] < l1[0] - 0.5, "training did not learn, so the comparison proves little"
    # evaluation passed the batches through the stages: the same accuracy and loss as the whole model's
    assert s2["top1"] == s1["top1"]
    e1, e2 = (json.loads((run / "epochs.jsonl").read_text().splitlines()[-1]) for run in (one, pipe))
    assert e2["val_loss"] == pytest.approx(e1["val_loss"], rel=EXACT["rtol"])


def _measured_together(rank, world):
    from multirank import group

    from scaletrain.comm.pipeline.strategy import measured_together
    from scaletrain.split.stages import blocked

    torch.manual_seed(0)
    model = build_model("lenet5", num_classes=10, in_channels=3, image_size=32)
    graph = blocked(model, (3, 32, 32), 4)
    with group():
        costs = measured_together(graph, model, (3, 32, 32), 4)
    return graph.names, [(c.name, c.forward_s, c.backward_s) for c in costs]


def test_without_a_calibration_every_rank_times_the_blocks_and_all_take_the_same_costs(ranks):
    results = ranks.run(_measured_together, 2)
    (names, costs), (_, other) = results
    assert costs == other  # the mean over the ranks, on every rank: rank 0 splits on what all measured
    assert [c[0] for c in costs] == names and all(f > 0 and b > 0 for _, f, b in costs)


def _split_shown(rank, world):
    """What a rank prints while the pipeline measures its blocks and splits the model."""
    import contextlib
    import io
    from unittest import mock

    from multirank import group, train_config

    from scaletrain.comm.pipeline.strategy import Pipeline
    from scaletrain.distributed.rank import RankInfo
    from scaletrain.split import costs
    from scaletrain.split.stages import blocked

    cfg = train_config("--model", "lenet5", "--strategy", "pipeline", "--nproc", str(world), "--batch-size", "8",
                       "--microbatches", "2")
    model = build_model("lenet5", num_classes=10, in_channels=3, image_size=32)
    shown = io.StringIO()
    quick = mock.patch.object(costs, "_as_trained", lambda module, x, **kw: (1e-4, 2e-4))  # what, not how long
    with quick, group(), contextlib.redirect_stdout(shown):  # a log, not a terminal
        Pipeline(cfg, RankInfo(rank, rank, world, world), torch.device("cpu"), "gloo")._split(
            model, blocked(model, (3, 32, 32), 4), (3, 32, 32))
    return shown.getvalue()


def _split_link(rank, world):
    """The split a pipeline of `world` stages chooses on its measured blocks, and the link it chose it on."""
    from unittest import mock

    from multirank import group, train_config

    from scaletrain.comm.pipeline.strategy import Pipeline
    from scaletrain.distributed.rank import RankInfo
    from scaletrain.split import costs, plan
    from scaletrain.split.stages import blocked

    cfg = train_config("--model", "lenet5", "--strategy", "pipeline", "--nproc", str(world), "--batch-size", "8",
                       "--microbatches", "2")
    model = build_model("lenet5", num_classes=10, in_channels=3, image_size=32)
    asked = []
    real = plan.choose
    quick = mock.patch.object(costs, "_as_trained", lambda module, x, **kw: (1e-4, 2e-4))
    seen = mock.patch.object(plan, "choose", lambda *a, **kw: asked.append(kw) or real(*a, **kw))
    with quick, seen, group():
        _, info = Pipeline(cfg, RankInfo(rank, rank, world, world), torch.device("cpu"), "gloo")._split(
            model, blocked(model, (3, 32, 32), 4), (3, 32, 32))
    return info["link"], [(kw["link_bytes_per_s"], kw["latency_s"]) for kw in asked]


def test_the_split_is_chosen_on_the_link_measured_between_the_stages(ranks):
    """A timed split weighs the transfers it saves by the link its own stages measured (the same figures on every
    rank, at least 1 MiB a message), not by a guess: 10 Gbit/s, 30x too slow for NVLink, kept ResNet-50's first 11
    of 18 blocks in one of 8 stages on an A100 node's data sheet."""
    (link, asked), (other, none) = ranks.run(_split_link, 2)
    assert link == other and link["pairs"] == 1 and link["bytes"] == 1 << 20
    assert link["latency_s"] > 0 and link["bytes_per_s"] > 0
    assert asked == [(link["bytes_per_s"], link["latency_s"])] and none == []  # rank 0 chooses, once


def _links(rank, world):
    from multirank import group

    from scaletrain.distributed.p2p_link import measure_links

    with group():
        return measure_links([0, 1, 2], rank, torch.device("cpu"), 1 << 16), \
            measure_links([0], rank, torch.device("cpu"), 1 << 16)


def test_every_pair_of_neighbours_is_measured_and_the_slowest_reported_on_every_rank(ranks):
    results = ranks.run(_links, 3)
    assert all(r == results[0] for r in results) and results[0][1] is None
    link = results[0][0]
    assert link["pairs"] == 2 and link["bytes"] == 1 << 16 and link["latency_s"] > 0 and link["bytes_per_s"] > 0


def test_rank_0_says_that_it_measures_the_blocks_to_split(ranks):
    """--split auto times every block before the first step (45 s to 3 min at 1024 px): said, not silent."""
    first, second = ranks.run(_split_shown, 2)
    what = "pipeline split: measuring 5 blocks' costs on every rank (3 rounds, micro-batch 4)"
    lines = first.splitlines()
    assert lines[0] == f"{what} ..." and lines[1].startswith(f"{what}: 1/15 (")
    assert lines[-1].startswith(f"{what}: done in ")
    assert second == ""  # the job's lines, once


def test_pipeline_phases_add_up_and_have_a_bubble(lenet_runs):
    run = lenet_runs["1f1b"]
    for rank in (0, 1):
        records = [json.loads(x) for x in (run / f"metrics-rank{rank}.jsonl").read_text().splitlines()]
        for r in records:
            assert {"bubble", "p2p"} <= r["phases_s"].keys()
            assert sum(r["phases_s"].values()) == pytest.approx(r["step_time_s"], rel=1e-3, abs=2e-5)
            # the stage's timeline of the step: spans in order, tiling it, summing to the phases
            spans = r["spans_s"]
            assert spans[0][1] == 0 and all(a[2] == pytest.approx(b[1], abs=2e-7) for a, b in zip(spans, spans[1:]))
            assert spans[-1][2] == pytest.approx(r["step_time_s"], abs=2e-5)
            assert sum(e - b for name, b, e in spans if name == "forward") == pytest.approx(
                r["phases_s"]["forward"], abs=2e-5)
            assert len([1 for name, _, _ in spans if name == "forward"]) == 4  # one span per micro-batch
        assert sum(r["phases_s"]["forward"] for r in records) > 0
    # the last stage waits for stage 0's first activations: its bubble is not empty
    last = [json.loads(x) for x in (run / "metrics-rank1.jsonl").read_text().splitlines()]
    assert sum(r["phases_s"]["bubble"] for r in last) > 0
    s = summary(run)
    assert s["pipeline"]["bubble_theory"] == pytest.approx(1 / 5)


def test_the_report_shows_each_stage_and_its_bubble_against_theory(lenet_runs, tmp_path):
    import shutil

    from scaletrain.analysis.pipeline import stage_rows, timeline
    from scaletrain.report.build import write_run_report
    from scaletrain.report.load import load_run

    run = tmp_path / "run"
    shutil.copytree(lenet_runs["1f1b"], run)
    loaded = load_run(run)
    rows = stage_rows(summary(run)["pipeline"], loaded.records)
    assert [(r["rank"], r["stage"]) for r in rows] == [(0, 0), (1, 1)]
    for r in rows:  # the mean over steady steps, from the records themselves
        assert r["bubble_fraction"] == pytest.approx(r["phases_s"]["bubble"] / r["step_s"])
        assert 0 < r["bubble_fraction"] < 1 and r["bubble_theory"] == pytest.approx(1 / 5)
        assert r["rest_s"] >= 0 and r["blocks"]
    assert rows[0]["blocks"] + rows[1]["blocks"] == sum(summary(run)["pipeline"]["stage_blocks"], [])
    step, spans = timeline(loaded.records)
    assert set(spans) == {0, 1} and min(a for s in spans.values() for _, a, _ in s) == pytest.approx(0, abs=1e-3)
    # on one clock stage 1's first forward starts after stage 0's first forward (it needs its activation)
    first = {rank: next(a for name, a, _ in s if name == "forward") for rank, s in spans.items()}
    assert first[1] > first[0]
    html = write_run_report(run).read_text()
    assert (run / "plots" / "pipeline-timeline.png").stat().st_size > 5000
    assert "pipeline stages" in html and "measured bubble fraction" in html and "(K-1)/(M+K-1) = 20.0%" in html


# 4 ranks on 2 cores: make test-slow; the 2-stage twin (test_two_stages_follow_one_process_...) stays fast
@pytest.mark.slow
@pytest.mark.equivalence
def test_hybrid_two_replicas_of_two_stages_follow_one_process(lenet_runs, hybrid_run):
    one, hybrid = lenet_runs["one"], hybrid_run
    s = summary(hybrid)
    assert s["world_size"] == 4 and s["global_batch"] == 64 and s["pipeline"]["replicas"] == 2
    assert s["steps"] == summary(one)["steps"]
    held = s["pipeline"]["param_bytes_per_rank"]  # rank = replica x 2 + stage
    assert held[0] == held[2] and held[1] == held[3] and held[0] + held[1] == s["pipeline"]["model_param_bytes"]
    # averaging over replicas reorders float additions: ~1e-16 each, in float64
    assert_same_weights(one, hybrid)
    l1 = _losses(one)
    l2 = [(a + b) / 2 for a, b in zip(_losses(hybrid, 0), _losses(hybrid, 2))]  # replica 0's and 1's halves
    assert l2 == pytest.approx(l1, rel=EXACT["rtol"])


# ResNet-20 has BatchNorm: the pipeline normalises each micro-batch, as an eager micro-batch loop does.
# Synthetic data (no ties): on digits' blank borders ReLU and max-pool ties flip with the last bit, so even
# two eager loops summing the micro-batches' gradients in another order part ways after a few steps.
RESNET = ["--model", "resnet20", "--width", "0.5", "--dataset", "synthetic", "--synthetic-samples", "256",
          "--image-size", "16", "--batch-size", "32", "--lr", "0.02", "--no-augment", "--optimizer", "nesterov",
          "--seed", "1", *FP64]


RESNET_PIPELINE = [*RESNET, "--strategy", "pipeline", "--nproc", "2", "--microbatches", "4", "--split", "uniform",
                   "--epochs", "2"]


@pytest.fixture(scope="module")
def resnet_straight(tmp_path_factory, ranks):
    import multirank

    straight = tmp_path_factory.mktemp("pipeline-bn") / "straight"
    multirank.train(ranks, *RESNET_PIPELINE, "--out", str(straight), timeout=300)
    return straight


@pytest.fixture(scope="module")
def resnet_runs(tmp_path_factory, ranks, resnet_straight):
    import multirank

    broken = tmp_path_factory.mktemp("pipeline-bn-resume") / "broken"
    multirank.train(ranks, *RESNET_PIPELINE, "--stop-after", "1", "--out", str(broken), timeout=300)
    multirank.train(ranks, "--resume", "--out", str(broken), timeout=300)
    return resnet_straight, broken


@pytest.mark.equivalence
def test_batchnorm_per_microbatch_equals_an_eager_microbatch_loop(resnet_straight):
    run = resnet_straight
    s = summary(run)
    cfg = build_config({}, {"model": "resnet20", "width": 0.5, "dataset": "synthetic", "synthetic_samples": 256,
                            "image_size": 16, "batch_size": 32, "lr": 0.02, "augment": False,
                            "optimizer": "nesterov", "seed": 1, "epochs": 2, "precision": "fp64"})
    with made_in("fp64"):
        data, model = build_data_and_model(cfg)  # seeded as every rank builds it, in float64 as they do
    sampler = DistributedSampler(data.train, num_replicas=1, rank=0, shuffle=True, seed=1)
    loader = DataLoader(data.train, batch_size=32, sampler=sampler, collate_fn=collate, drop_last=True)
    optimizer = build_optimizer(cfg.optim, model, 1)
    scheduler = build_scheduler(cfg.optim, optimizer, len(loader), 1)
    criterion = torch.nn.CrossEntropyLoss()
    model.train()
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y, _ in loader:
            optimizer.zero_grad(set_to_none=True)
            for xm, ym in zip(x.double().chunk(4), y.chunk(4)):
                (criterion(model(xm), ym) / 4).backward()
            optimizer.step()
            scheduler.step()
    piped = weights(run)
    eager = model.state_dict()
    # no shape-inference forward: the statistics were updated once per micro-batch, never more
    tracked = [k for k in eager if k.endswith("num_batches_tracked")]
    assert tracked and all(int(piped[k]) == s["steps"] * 4 == int(eager[k]) for k in tracked)
    for name in eager:
        torch.testing.assert_close(piped[name], eager[name], **EXACT, msg=name)


def test_a_resumed_pipeline_run_replays_exactly(resnet_runs):
    straight, broken = resnet_runs
    a = torch.load(straight / "checkpoint.pt", weights_only=True)
    b = torch.load(broken / "checkpoint.pt", weights_only=True)
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    # the checkpoint's optimizer state is every stage's, merged: one momentum per parameter
    assert len(a["optimizer"]["state"]) == len(list(build_model(
        "resnet20", num_classes=10, in_channels=3, image_size=16, width=0.5).parameters()))
    for key, state in a["optimizer"]["state"].items():
        assert torch.equal(state["momentum_buffer"], b["optimizer"]["state"][key]["momentum_buffer"])
    assert summary(broken)["status"] == "completed" and summary(broken)["steps"] == summary(straight)["steps"]
    assert _losses(broken, 1) == _losses(straight, 1)


@pytest.mark.parametrize("extra, words", [
    (["--stages", "6", "--nproc", "6", "--microbatches", "8"], "more than the 5 blocks"),
    (["--nproc", "2", "--microbatches", "1"], "--microbatches 1 is fewer than the 2 stages"),
    (["--nproc", "2", "--microbatches", "3"], "does not divide --batch-size"),
    (["--stages", "2", "--nproc", "3"], "multiple of 2 processes"),
    (["--nproc", "2", "--precision", "fp16"], "fp16 is not supported"),
    (["--nproc", "2", "--compress", "fp16"], "--compress is not supported"),
    (["--nproc", "2", "--pipeline-schedule", "zbv"], "--pipeline-schedule must be one of"),
    (["--nproc", "2x2", "--stages", "3"], "means 2 stages, but --stages is 3"),
])
def test_bad_pipeline_requests_are_one_line_and_exit_2(tmp_path, capsys, extra, words):
    code = main(["train", "--model", "lenet5", "--dataset", "digits", "--batch-size", "32", "--strategy", "pipeline",
                 *extra, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()
