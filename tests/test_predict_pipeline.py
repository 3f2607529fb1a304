"""predict/pipeline.py: a pipeline's stages are priced as the ranks run them (each at its share of the cores,
beside the other stages), split and stepped as split/partition.py says; FSDP's collectives per unit."""

from __future__ import annotations

import pytest
from torch import nn

from predict_fixtures import NETWORK, fake_calibration
from scaletrain.comm.fsdp import collective_seconds
from scaletrain.config import TrainConfig
from scaletrain.predict.node_times import node_times
from scaletrain.predict import pipeline as PP
from scaletrain.predict.predictor import Predictor


def two_core_calibration():
    """The fake calibration of a 2-core machine (1 and 2 threads, eight shapes per op kind) whose reference
    network ran on 1 rank at 2 threads and on 2 ranks at 1 thread each, the second 3x slower per op
    than the first predicts: their loop factors differ."""
    cal = fake_calibration(threads=(1, 2))
    kept: dict[tuple, list] = {}
    for row in cal["layers"]:
        kept.setdefault((row["kind"], row["threads"]), []).append(row)
    cal["layers"] = [row for rows in kept.values() for row in rows[:8]]
    one = cal["loop"]["runs"][0]
    phases = {k: 3 * v if k in ("forward", "backward") else v for k, v in one["phases_mean_s"].items()}
    cal["loop"]["runs"].append({**one, "nproc": 2, "threads": 1, "batch_size": 32, "phases_mean_s": phases})
    return cal


CAL = two_core_calibration()


def test_ops_priced_at_one_thread_on_two_cores_take_the_two_rank_loop_factors():
    model, batch = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), 4
    p = Predictor(CAL, NETWORK)
    assert p.loop(2).forward != pytest.approx(p.loop(1).forward)  # the two runs disagree
    from scaletrain.predict.ops import trace_ops

    ops = p.op_costs(trace_ops(model, (8,), batch), "fp32", 1)

    def priced(loop):
        return sum(c.forward_s * loop.factor(c.group, "forward") for c in ops), \
            sum(c.backward_s * loop.factor(c.group, "backward") for c in ops)

    def total(times):
        return sum(f for f, _ in times.values()), sum(b for _, b in times.values())

    # one thread on two cores: one of two ranks, the factors calibrated with one thread
    assert total(node_times(model, (8,), batch, CAL, threads=1)) == pytest.approx(priced(p.loop(2)))
    assert total(node_times(model, (8,), batch, CAL, threads=1, ranks=2)) == pytest.approx(priced(p.loop(2)))
    # said otherwise, as asked; and the default (all cores) stays one rank's
    assert total(node_times(model, (8,), batch, CAL, threads=1, ranks=1)) == pytest.approx(priced(p.loop(1)))
    both = Predictor(CAL, NETWORK).op_costs(trace_ops(model, (8,), batch), "fp32", 2)
    one_rank = p.loop(1)
    assert total(node_times(model, (8,), batch, CAL)) == pytest.approx(
        (sum(c.forward_s * one_rank.factor(c.group, "forward") for c in both),
         sum(c.backward_s * one_rank.factor(c.group, "backward") for c in both)))


def test_a_two_stage_pipeline_prices_its_blocks_as_two_ranks_of_one_thread():
    cfg = TrainConfig.from_dict(dict(model="lenet5", strategy="pipeline", nproc=2, batch_size=8, microbatches=2))
    facts = {"image_size": 28, "classes": 10, "channels": 1}
    pp = PP.pipeline_phases(Predictor(CAL, NETWORK), cfg, facts, 1, (1e-4, 1e-9))
    k, m = len(pp["split"]["stages"]), cfg.pipeline.microbatches
    assert k == 2
    model, blocked = PP._blocked("lenet5", 10, 1, 28, 4, "auto", 1.0)
    for ranks, same in ((2, True), (1, False)):
        times = node_times(model, (1, 28, 28), 4, CAL, threads=1, ranks=ranks)
        forward = sum(f for f, _ in times.values())  # every block's forward at the micro-batch of 4
        # the phase is M micro-batches of the mean stage: M / K of the whole model's forward
        assert (pp["forward"] * k / m == pytest.approx(forward)) is same


@pytest.mark.parametrize("split", ["auto", "time"])
def test_the_predicted_split_is_the_one_the_run_chooses(split):
    from scaletrain.split import plan
    from scaletrain.split.partition import evaluate

    cfg = TrainConfig.from_dict(dict(model="lenet5", strategy="pipeline", nproc=2, batch_size=8, microbatches=2,
                                     split=split))
    facts = {"image_size": 28, "classes": 10, "channels": 1}
    pp = PP.pipeline_phases(Predictor(CAL, NETWORK), cfg, facts, 1, (1e-4, 1e-9))
    model, blocked = PP._blocked("lenet5", 10, 1, 28, 4, "auto", 1.0)
    # as comm/pipeline/strategy.py asks for it: the blocks priced as the ranks run them (one thread each, two ranks'
    # loop factors), the link between the stages (which the run measures: here the calibrated point-to-point one)
    costs, _ = plan.costs_for(blocked, model, (1, 28, 28), 4, calibration=CAL, threads=1, ranks=2)
    run = plan.choose(split, blocked, model, (1, 28, 28), stages=2, microbatches=2, schedule="1f1b", batch_size=8,
                      calibration=CAL, model_name="lenet5", costs=costs, link_bytes_per_s=1e9, latency_s=1e-4)
    assert pp["split"]["bounds"] == [list(b) for b in run.bounds]
    # its step with the transfers at that link, not plan's default one
    priced = evaluate(costs, run.bounds, **plan.pipeline_args(microbatches=2, schedule="1f1b",
                                                              link_bytes_per_s=1e9, latency_s=1e-4))
    assert pp["split"]["step_s"] == pytest.approx(priced.step_s) == pytest.approx(run.step_s)
    default = evaluate(costs, run.bounds, **plan.pipeline_args(microbatches=2, schedule="1f1b"))
    assert pp["split"]["step_s"] != pytest.approx(default.step_s)


def test_fsdp_gathers_twice_and_scatters_once_per_unit():
    f, b = collective_seconds([1000, 3000], 2, 1e-4, 1e-9)
    assert b == pytest.approx(2 * f) and f > 0
    assert collective_seconds([1000], 1, 1e-4, 1e-9) == (0.0, 0.0)
    # each of the 2 units' collectives also waits for the slower rank: once in forward, twice in backward
    fs, bs = collective_seconds([1000, 3000], 2, 1e-4, 1e-9, skew=2e-3)
    assert fs - f == pytest.approx(2 * 2e-3) and bs - b == pytest.approx(2 * 2 * 2e-3)


def test_the_skew_of_computing_ranks_is_the_halo_fits_latency_beyond_the_idle_one():
    from types import SimpleNamespace

    from scaletrain.predict.pricing import Pricing

    def pricing(network):
        return Pricing(SimpleNamespace(nnodes=1), [], None, network, None, {}, 1.0)

    halo = {**NETWORK["intra"], "halo": {"alpha_s": 1.8e-3, "beta_s_per_byte": 1e-9}}
    assert pricing({"intra": halo, "inter": None}).skew_s() == pytest.approx(1.8e-3 - 1e-4)
    assert pricing(NETWORK).skew_s() == 0.0  # no halo fit (a data sheet, an older calibration): none


def test_fsdp_is_priced_with_the_skew_of_each_units_collectives_and_a_parameter_server_as_its_workers_compute(
        monkeypatch):
    """FSDP on 2 ranks: forward grows by one skew a unit (the calibration's halo fit); ps-sync on 2 ranks (1 worker,
    1 server that waits) takes the training loop of one computing rank, allreduce that of two."""
    from scaletrain.comm.fsdp import unit_bytes
    from scaletrain.config import build_config
    from scaletrain.predict.points import data_facts, predict_config

    flags = {"model": "lenet5", "dataset": "digits", "nproc": 2, "batch_size": 16}
    halo = {"intra": {**NETWORK["intra"], "halo": {"alpha_s": 3e-3, "beta_s_per_byte": 1e-9}}, "inter": None}
    cfg = build_config({}, {**flags, "strategy": "fsdp"})
    plain = predict_config(Predictor(CAL, NETWORK), cfg)["phases_s"]
    skewed = predict_config(Predictor(CAL, halo), cfg)["phases_s"]
    units = len(unit_bytes("lenet5", data_facts("digits", None, 0, 10), cfg.model.stem, cfg.model.width))
    assert skewed["forward"] - plain["forward"] == pytest.approx(units * (3e-3 - 1e-4))
    assert skewed["backward"] - plain["backward"] == pytest.approx(2 * units * (3e-3 - 1e-4))
    asked = []
    real = Predictor.loop
    monkeypatch.setattr(Predictor, "loop", lambda self, n: asked.append(n) or real(self, n))
    for strategy in ("ps-sync", "allreduce"):
        predict_config(Predictor(CAL, NETWORK), build_config({}, {**flags, "strategy": strategy}))
    assert asked == [1, 2]


def test_prediction_json_gives_each_pipeline_point_its_split(tmp_path):
    import json

    from scaletrain.cli import main
    from scaletrain.predict import calibration

    cal = calibration.save(CAL, tmp_path / "cal.json")
    out = tmp_path / "pred"
    assert main(["predict", "--calibration", str(cal), "--out", str(out), "--dataset", "synthetic",
                 "--synthetic-samples", "256", "--image-size", "28", "--model", "lenet5", "--strategy", "pipeline",
                 "--nproc", "2", "--batch-size", "8", "--microbatches", "2", "--split", "auto,uniform"]) == 0
    points = json.loads((out / "prediction.json").read_text())["points"]
    assert len(points) == 2
    for point in points:
        pp = point["pipeline"]
        assert pp["split_method"] == point["config"]["split"] and len(pp["split"]["bounds"]) == 2
        assert pp["bubble_theory"] == pytest.approx(1 / 3)
        assert "bubble" in point["phases_s"]


def test_a_stages_messages_are_priced_as_point_to_point_not_as_an_all_reduce(tmp_path):
    import copy
    import json

    from scaletrain.cli import main
    from scaletrain.predict import calibration

    cal = copy.deepcopy(CAL)  # an all-reduce with a second of latency per step; a send and receive of 100 us
    cal["network"]["fits"]["allreduce"] = {"alpha_s": 1.0, "beta_s_per_byte": 1e-9}
    cal["network"]["fits"]["ps"] = {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9}
    out = tmp_path / "pred"
    assert main(["predict", "--calibration", str(calibration.save(cal, tmp_path / "cal.json")), "--out", str(out),
                 "--dataset", "synthetic", "--synthetic-samples", "256", "--image-size", "28", "--model", "lenet5",
                 "--strategy", "pipeline", "--nproc", "2", "--batch-size", "8", "--microbatches", "2"]) == 0
    point = json.loads((out / "prediction.json").read_text())["points"][0]
    stages = point["pipeline"]["split"]["stages"]
    from scaletrain.models.registry import build_model
    from scaletrain.split.costs import block_sizes
    from scaletrain.split.stages import blocked

    graph = blocked(build_model("lenet5", num_classes=10, in_channels=3, image_size=28), (3, 28, 28), 1)  # synthetic
    # the one tensor crossing the cut (its gradient comes back as large), at the micro-batch of 4
    cut = block_sizes(graph, 4)[stages[0]["last"]].out_bytes
    # each stage sends and receives the activation and its gradient once per micro-batch
    assert stages[0]["transfer_s"] == pytest.approx(2 * (1e-4 + cut * 1e-9))
    assert point["phases_s"]["p2p"] < 0.01


def test_a_pipelines_split_is_searched_once_for_points_that_differ_in_loader_workers_alone(monkeypatch):
    from scaletrain.split import plan

    asked = []
    real = plan.choose
    monkeypatch.setattr(plan, "choose", lambda *a, **kw: asked.append(kw) or real(*a, **kw))
    facts = {"image_size": 28, "classes": 10, "channels": 1}
    p = Predictor(CAL, NETWORK)
    phases = [PP.pipeline_phases(p, TrainConfig.from_dict(dict(model="lenet5", strategy="pipeline", nproc=2,
                                                                batch_size=b, microbatches=2, workers=w)),
                                 facts, 1, (1e-4, 1e-9)) for w, b in ((0, 8), (4, 8), (0, 16))]
    assert len(asked) == 2 and phases[0] is phases[1] and phases[2] != phases[0]


@pytest.mark.parametrize("value", ["blocks", "layer2.0,layer3.1"])
def test_a_pipelines_recomputed_blocks_run_their_forward_again_on_the_split_the_run_chooses(value):
    """--checkpoint-activations in a pipeline: the split is the one chosen on the blocks timed without the recompute
    (as the run times them); each recomputed block's backward gains its forward, and the step is that split played
    with it: slower by at least the recomputes of the slowest stage, at most all of them."""
    from scaletrain.split.partition import evaluate
    from scaletrain.split import plan

    facts = {"image_size": 32, "classes": 10, "channels": 3}
    p = Predictor(CAL, NETWORK)

    def priced(checkpoint):
        cfg = TrainConfig.from_dict(dict(model="resnet20", strategy="pipeline", nproc=2, batch_size=8, microbatches=2,
                                         checkpoint_activations=checkpoint))
        return cfg, PP.pipeline_phases(p, cfg, facts, 1, (1e-4, 1e-9))

    cfg, plain = priced("none")
    again = priced(value)[1]
    assert again["split"]["bounds"] == plain["split"]["bounds"]
    model, graph, shape, micro = PP.blocked_model(cfg, facts)
    costs = PP.priced_blocks(p, cfg, graph, model, shape, micro, 1)
    names = graph.names if value == "blocks" else value.split(",")
    assert set(names) <= set(graph.names)
    extra = {c.name: c.forward_s for c in costs if c.name in names}
    redone = [c.__class__(c.name, c.forward_s, c.backward_s + extra.get(c.name, 0.0), c.param_bytes, c.saved_bytes,
                          c.out_bytes) for c in costs]
    expected = evaluate(redone, [tuple(b) for b in plain["split"]["bounds"]], **plan.pipeline_args(
        microbatches=2, schedule=cfg.pipeline.schedule, link_bytes_per_s=1e9, latency_s=1e-4))
    assert again["split"]["step_s"] == pytest.approx(expected.step_s)
    assert again["backward"] - plain["backward"] == pytest.approx(2 * sum(extra.values()) / 2)  # M x mean over K
    assert again["forward"] == pytest.approx(plain["forward"])
    assert again["split"]["step_s"] > plain["split"]["step_s"]


def test_a_pipeline_the_launcher_refuses_is_not_priced():
    """Fewer micro-batches than stages: torch's schedules refuse it, so the launcher does, and predict (and a plan)
    with it; it had priced such a point (a plan ranked 8-stage pipelines of 4 micro-batches)."""
    from scaletrain.errors import UserError
    from scaletrain.predict.points import predict_config

    cfg = TrainConfig.from_dict(dict(model="lenet5", strategy="pipeline", nproc=4, batch_size=8, microbatches=2,
                                     dataset="synthetic", synthetic_samples=256, image_size=28))
    with pytest.raises(UserError, match="fewer than the 4 stages"):
        predict_config(Predictor(CAL, NETWORK), cfg)
