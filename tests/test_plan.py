"""`scaletrain plan`: the candidates a request allows (one grid per strategy, its own options), options that do not
combine skipped with their reason (never aborting the search), the memory budget, the ranking by time to train
with ties to the simpler configuration, plan.json and plan.png, and bad requests in one line."""

import json

import pytest

from scaletrain.cli import main
from scaletrain.plan.search import TIE, rank_key
from scaletrain.plan.space import Request, grid_name, grids, stage_counts
from scaletrain.predict.cli import predict_spec
from scaletrain.study.grid import points

LENET = ("plan", "--model", "lenet5", "--nodes", "1", "--nproc", "2", "--hardware", "dgx-a100-80gb",
         "--batch-size", "64", "--dataset", "digits")


def test_each_strategy_searches_its_own_options():
    space = grids(Request(model="resnet50", nodes=2, nproc=4), "cuda", 32)
    by = {grid_name(g): g for g in space}
    # a pipeline's grids one per depth (and tile count), each with its own micro-batch counts: ids stay unique
    assert set(by) == {"allreduce", "ring", "ps-sync", "fsdp", "pipeline-stages2", "pipeline-stages4",
                       "pipeline-stages8", "spatial", "spatial-staged-tiles2-stages2", "spatial-staged-tiles2-stages4",
                       "spatial-staged-tiles4-stages2"}  # tiles in stages: only tiles x stages dividing the 8 ranks
    assert by["spatial"]["spatial"] == [2, 4, 8] and "stages" not in by["spatial"]  # (ps-async: left out, why)
    assert by["pipeline-stages8"]["microbatches"] == [8, 16, 32]  # none fewer than the stages (the launcher refuses)
    assert by["spatial-staged-tiles2-stages4"]["microbatches"] == [4, 8, 16]
    assert "compress" in by["allreduce"] and "compress" not in by["ring"] and "compress" not in by["fsdp"]
    assert [by[f"pipeline-stages{k}"]["stages"] for k in (2, 4, 8)] == [[2], [4], [8]]
    assert "stages" not in by["allreduce"]
    assert by["allreduce"]["workers"] == [0, 1, 2, 4, 8]  # 32 cores over 4 ranks a node: 8 each at most
    assert by["allreduce"]["precision"] == ["fp32", "bf16", "fp16"]
    assert by["allreduce"]["batch_size"] == [16, 32, 64, 128, 256]
    fixed = grids(Request(model="resnet50", nodes=1, nproc=2, global_batch=256), "cpu", 2, budget=None)
    assert all("batch_size" not in g for g in fixed) and fixed[0]["precision"] == ["fp32", "bf16"]
    assert fixed[0]["checkpoint_activations"] == ["none"]  # no budget: auto would checkpoint nothing
    assert stage_counts(6, 3) == [2] and stage_counts(1, 1) == []  # 4 does not divide 6; one rank has no pipeline
    assert "pipeline" not in {g["strategy"][0] for g in grids(Request(model="lenet5", nodes=1, nproc=1), "cpu", 2)}


def test_every_candidate_of_a_plan_has_its_own_id():
    space = grids(Request(model="resnet50", nodes=4, nproc=8), "cuda", 64)
    ids = [f"{grid_name(g)}-{p.id}" for g in space
           for p in points(predict_spec(None, g, {"model": "resnet50"}), keep_refused=True)]
    assert len(ids) == len(set(ids)) > 2000


def test_options_that_do_not_combine_are_kept_with_their_reason():
    spec = predict_spec(None, {"nproc": [2], "strategy": ["ps-sync", "allreduce"], "precision": ["fp16"]},
                        {"model": "lenet5", "dataset": "digits"})
    refused = [p for p in points(spec, keep_refused=True) if p.refused]
    assert len(refused) == 1 and refused[0].config is None and "fp16 is not supported" in refused[0].refused
    with pytest.raises(Exception, match="fp16 is not supported"):
        points(spec)  # a study runs what it is asked: the same combination is refused there


def test_ties_go_to_the_simpler_configuration():
    def cand(t, compress="none", workers=0, memory=1):
        return {"id": f"{t}-{compress}-{workers}", "time_to_train_s": t, "peak_memory_bytes": memory,
                "config": {"compress": compress, "checkpoint_activations": "none", "workers": workers}}

    a, b = cand(100.0, compress="fp16"), cand(100.0 * (1 + TIE / 4))
    assert sorted([a, b], key=rank_key)[0] is b  # within half a percent: no compression wins
    c = cand(100.0 * (1 + 3 * TIE))
    assert sorted([a, c], key=rank_key)[0] is a  # clearly faster wins whatever it pulls
    assert sorted([cand(50.0, workers=4), cand(50.0, workers=0)], key=rank_key)[0]["config"]["workers"] == 0


@pytest.fixture(scope="module")
def lenet_plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "p"
    assert main([*LENET, "--out", str(out)]) == 0
    return out, json.loads((out / "plan.json").read_text())


def test_a_plan_prices_ranks_and_explains(lenet_plan, capsys):
    out, plan = lenet_plan
    assert (out / "plan.png").stat().st_size > 10_000
    assert plan["kind"] == "plan" and plan["basis"] == "datasheet" and plan["priced"] > 100
    assert plan["candidates"] == plan["priced"] + sum(r["candidates"] for r in plan["skipped_why"]) + \
        len(plan["pruned"])
    assert {s["id"].split("-")[0] for s in plan["skipped"]} >= {"ps"}  # ps-sync at fp16: skipped, search went on
    assert any("fp16 is not supported" in r["reason"] for r in plan["skipped_why"])
    ranked = plan["ranked"]
    assert [c["rank"] for c in ranked] == list(range(1, len(ranked) + 1))
    assert ranked == sorted(ranked, key=rank_key) and plan["chosen"] == ranked[0]["id"]
    assert len({c["id"] for c in ranked}) == len(ranked)  # every strategy's grid named apart
    pruned = {name for name in ("allreduce", "ring", "ps-sync", "fsdp", "pipeline")
              if any(i.startswith(name + "-") for i in plan["pruned"])}
    # (a pipeline on the data sheet too: its blocks by the roofline, pruned by their compute over its stages)
    assert {c["axes"]["strategy"] for c in ranked} | pruned == {"allreduce", "ring", "ps-sync", "fsdp", "pipeline"}
    first = ranked[0]
    assert first["time_to_train_s"] == pytest.approx(first["epoch_time_s"])  # one epoch asked
    assert first["global_batch"] == 2 * first["config"]["batch_size"] and first["limit"]


def test_pruning_by_the_models_bound_leaves_the_top_as_pricing_every_candidate_does(lenet_plan, tmp_path, capsys):
    out, plan = lenet_plan
    assert main([*LENET, "--no-prune", "--out", str(tmp_path / "all")]) == 0
    full = json.loads((tmp_path / "all" / "plan.json").read_text())
    assert plan["pruned"] and full["pruned"] == [] and full["priced"] == plan["priced"] + len(plan["pruned"])
    top = lambda p: [(c["id"], c["time_to_train_s"]) for c in p["ranked"][:5]]  # noqa: E731
    assert top(plan) == top(full)
    times = {c["id"]: c["time_to_train_s"] for c in full["ranked"]}
    assert all(times[i] > full["ranked"][4]["time_to_train_s"] for i in plan["pruned"] if i in times)
    from scaletrain.plan.present import skipped_grid

    assert any(row[0] == str(len(plan["pruned"])) and "pruned by the model's bound" in row[1]
               for row in skipped_grid(plan).rows)


def test_pruning_never_drops_a_candidate_the_model_cannot_tell_from_the_chosen_one(tmp_path, capsys):
    # ResNet-20 on 8 A100s: 16 candidates within the data sheet's band, 12 of them among those a bound at the 5th
    # fastest alone would keep
    flags = ["plan", "--model", "resnet20", "--nodes", "1", "--nproc", "8", "--hardware", "dgx-a100-80gb",
             "--dataset", "synthetic", "--batch-size", "64,128", "--workers", "4,8", "--checkpoint-activations", "none"]
    assert main([*flags, "--out", str(tmp_path / "p")]) == 0
    assert main([*flags, "--no-prune", "--out", str(tmp_path / "all")]) == 0
    plan, full = (json.loads((tmp_path / d / "plan.json").read_text()) for d in ("p", "all"))
    assert plan["pruned"] and plan["uncertain"] == full["uncertain"] and full["uncertain"]["count"] > 5
    band = full["ranked"][0]["time_to_train_s"] * (1 + full["uncertain"]["band"])
    times = {c["id"]: c["time_to_train_s"] for c in full["ranked"]}
    assert all(times[i] > band for i in plan["pruned"] if i in times)


def test_every_bound_is_under_the_epoch_it_bounds(monkeypatch, tmp_path, capsys):
    """The floor a plan prunes by (the whole model's compute; a pipeline's, or its tiles' in stages, blocks over the
    stages) is under the epoch pricing gives, candidate by candidate: pruning by it is exact only so."""
    from scaletrain.plan import search
    from scaletrain.predict.points import epoch_floor_s

    seen: list[list] = []

    def prune(self, cfg):
        kind = cfg.strategy.name + ("-staged" if cfg.layout.stages > 1 and cfg.strategy.name == "spatial" else "")
        seen.append([kind, epoch_floor_s(self.predictor, cfg), None])

    monkeypatch.setattr(search.Bound, "prune", prune)
    monkeypatch.setattr(search.Bound, "priced", lambda self, entry: seen[-1].__setitem__(2, entry["epoch_time_s"]))
    assert main(["plan", "--model", "resnet20", "--nodes", "1", "--nproc", "4", "--hardware", "dgx-a100-80gb",
                 "--precision", "fp32", "--workers", "0", "--compress", "none", "--checkpoint-activations", "none",
                 "--batch-size", "32,64", "--out", str(tmp_path / "p")]) == 0
    bounded = [(kind, floor, epoch) for kind, floor, epoch in seen if floor is not None and epoch is not None]
    assert {kind for kind, _, _ in bounded} == {"allreduce", "ring", "ps-sync", "fsdp", "pipeline", "spatial-staged"}
    assert all(0 < floor <= epoch for _, floor, epoch in bounded)


def test_the_memory_budget_leaves_out_what_does_not_fit(tmp_path, capsys):
    out = tmp_path / "p"
    assert main([*LENET, "--memory-per-device", "1KiB", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fits 1KiB" in err[0] and "--memory-per-device" in err[0]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["ranked"] == [] and len(plan["over_budget"]) == plan["priced"] > 0


@pytest.mark.parametrize("extra, words", [
    (("--global-batch", "128"), "both set the batch"),
    (("--nodes", "0"), "--nodes 0: give at least 1"),
    (("--calibration", "x.json"), "one basis"),
])
def test_bad_requests_are_one_line(tmp_path, capsys, extra, words):
    assert main([*LENET, *extra, "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "p").exists()


def test_a_plan_never_writes_into_another_commands_result(tmp_path, capsys):
    (tmp_path / "prediction.json").write_text("{}")
    assert main([*LENET, "--out", str(tmp_path)]) == 2
    assert "holds a prediction" in capsys.readouterr().err


def test_the_report_is_rebuilt_from_plan_json(lenet_plan, capsys):
    out, plan = lenet_plan
    page = (out / "report.html").read_text()
    assert "the configuration to run" in page and "data:image/png;base64," in page
    (out / "report.html").unlink()
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "plan: the 5 fastest" in printed and "report.html" in printed
    assert "chosen: " + plan["ranked"][0]["axes"]["strategy"] in (out / "report.html").read_text()
    assert main(["compare", str(out), str(out)]) == 2
    assert "a plan ranks its candidates itself" in capsys.readouterr().err


def test_a_damaged_plan_is_one_line(tmp_path, capsys):
    (tmp_path / "plan.json").write_text('{"kind": "plan"')
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a plan scaletrain plan wrote" in err[0]


def test_train_runs_what_the_plan_chose_and_flags_override_it(lenet_plan, tmp_path):
    from scaletrain.cli import build_parser
    from scaletrain.train.cli import train_config

    out, plan = lenet_plan
    first, second = plan["ranked"][0], plan["ranked"][1]

    def cfg(*extra):
        return train_config(build_parser().parse_args(["train", "--plan", str(out), "--out", str(tmp_path / "r"),
                                                       *extra]))

    c = cfg()
    assert (c.strategy.name, c.optim.batch_size, c.data.workers, c.model.precision, c.launch.nproc) == (
        first["axes"]["strategy"], first["config"]["batch_size"], first["axes"]["workers"], first["axes"]["precision"],
        2)
    assert c.model.name == "lenet5" and c.data.dataset == "digits"
    if first["bucket_cap_mb"] is not None:
        assert c.strategy.bucket_cap_mb == first["bucket_cap_mb"]  # the bucket the plan priced, not `auto` again
    assert cfg("--batch-size", "8").optim.batch_size == 8  # a flag given wins
    k = cfg("--plan-rank", "2")
    assert (k.strategy.name, k.model.precision, k.data.workers) == (second["axes"]["strategy"],
                                                                    second["axes"]["precision"],
                                                                    second["axes"]["workers"])
    with pytest.raises(Exception, match="--plan-rank 999: the plan in"):
        cfg("--plan-rank", "999")
    with pytest.raises(Exception, match="no plan.json there"):
        train_config(build_parser().parse_args(["train", "--plan", str(tmp_path), "--out", str(tmp_path / "r")]))
