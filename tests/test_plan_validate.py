"""`scaletrain plan --validate K`: the top candidates re-ranked by measurement with the machine's drift cancelled
(paired rounds), the chosen one against the measured best and the spread that says whether the difference is
real, what this machine cannot validate refused in one line, narrowed axes, and `train --plan` running the
measured best; end to end (slow) the runs themselves."""

import json
import os
import shutil
import subprocess

import pytest

from scaletrain.cli import main
from scaletrain.plan.agreement import compare
from scaletrain.plan.chosen import chosen_rank, planned_settings
from scaletrain.plan.measure import brief_flags, steps_for, steps_said
from scaletrain.plan.space import Request, grids
from scaletrain.validate.match import MeasuredRun


def cand(rank, step, epoch_steps=10, batch=64):
    return {"id": f"c{rank}", "rank": rank, "step_time_s": step, "time_to_train_s": step * epoch_steps,
            "epoch_time_s": step * epoch_steps, "samples_per_s": batch / step, "phases_s": {"forward": step},
            "peak_memory_bytes": 1 << 20, "memory_kind": "rss", "global_batch": batch,
            "config": {"dataset": "synthetic", "batch_size": batch}}


def runs(cid, steps):
    return [MeasuredRun(run_dir=f"validation/{cid}/r{k}", config={}, step_time_s=s, phases_s={"forward": s},
                        samples_per_s=64 / s) for k, s in enumerate(steps)]


def test_the_ranking_is_redone_from_rounds_measured_side_by_side():
    ranked = [cand(1, 0.010), cand(2, 0.011), cand(3, 0.012)]
    # the machine slows by half in round two: absolute times move 50%, the paired ratios do not
    measured = {"c1": runs("c1", [0.012, 0.018]), "c2": runs("c2", [0.010, 0.015]),
                "c3": runs("c3", [0.0132, 0.0198])}
    v = compare(ranked, measured)
    assert v["measured_order"] == ["c2", "c1", "c3"] and v["best"] == "c2" and v["chosen_is_best"] is False
    rows = {r["id"]: r for r in v["candidates"]}
    assert rows["c2"]["ratio_to_chosen"]["measured"] == pytest.approx(10 / 12)
    assert rows["c2"]["ratio_to_chosen"]["spread"] == pytest.approx(0.0, abs=1e-12)  # drift cancelled
    assert rows["c1"]["ratio_to_chosen"]["spread"] is None  # the chosen one against itself
    assert v["chosen_behind_best"] == pytest.approx(0.2) and v["best_by_beyond_spread"] is True
    assert rows["c3"]["ratio_to_chosen"]["error"] == pytest.approx(1.2 / 1.1 - 1)  # predicted 1.2, measured 1.1
    assert rows["c1"]["measured"]["spread"] == pytest.approx(0.4)  # absolute times: the drift shows
    assert v["kendall_tau"] == pytest.approx(1 / 3) and v["top3_predicted_ranks"] == [2, 1, 3]
    assert v["summary"]["count"] == 3 and v["summary"]["under"] == 3  # every step predicted fast


def test_one_disturbed_run_moves_its_candidate_not_its_round():
    ranked = [cand(1, 0.010), cand(2, 0.011), cand(3, 0.012)]
    # the chosen one's second run ran 3x slow on its own (another process): the round's drift is the others'
    measured = {"c1": runs("c1", [0.010, 0.030, 0.010]), "c2": runs("c2", [0.012] * 3),
                "c3": runs("c3", [0.011] * 3)}
    v = compare(ranked, measured)
    assert v["round_drift"] == {"r0": 1.0, "r1": 1.0, "r2": 1.0}
    rows = {r["id"]: r for r in v["candidates"]}
    assert rows["c2"]["ratio_to_chosen"]["measured"] == pytest.approx(1.2)
    assert rows["c3"]["ratio_to_chosen"]["measured"] == pytest.approx(1.1)
    assert rows["c2"]["ratio_to_chosen"]["spread"] == pytest.approx(0.0, abs=1e-12)  # two of three rounds agree
    assert v["chosen_is_best"] and v["measured_order"] == ["c1", "c3", "c2"]


def test_a_difference_within_the_rounds_spread_keeps_the_models_choice(tmp_path):
    ranked = [cand(1, 0.010), cand(2, 0.0102)]
    measured = {"c1": runs("c1", [0.010, 0.010]), "c2": runs("c2", [0.0093, 0.0105])}  # ratio 0.93 and 1.05
    v = compare(ranked, measured)
    assert v["best"] == "c2" and v["best_by_beyond_spread"] is False
    plan = {"kind": "plan", "ranked": [{**c, "axes": {}, "bucket_cap_mb": None,
                                        "config": {"model": "lenet5", "batch_size": 32 * c["rank"], "nproc": 1,
                                                   "dataset": "digits"}} for c in ranked], "validation": v}
    assert chosen_rank(plan) == 1
    plan["validation"] = compare(ranked, {"c1": runs("c1", [0.010, 0.011]), "c2": runs("c2", [0.008, 0.0089])})
    assert plan["validation"]["best_by_beyond_spread"] is True and chosen_rank(plan) == 2
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    assert planned_settings(str(tmp_path))["batch_size"] == 64  # train --plan runs the measured best
    assert planned_settings(str(tmp_path), 1)["batch_size"] == 32


def test_a_candidate_that_failed_is_left_out_of_the_reranking():
    ranked = [cand(1, 0.010), cand(2, 0.011)]
    v = compare(ranked, {"c2": runs("c2", [0.02, 0.02])})
    assert v["best"] == "c2" and v["chosen_is_best"] is False and v["chosen_behind_best"] is None
    assert v["candidates"][0]["runs"] == 0 and v["candidates"][0]["measured_rank"] is None
    assert compare(ranked, {})["best"] is None


def test_brief_runs_cut_the_epoch_or_repeat_the_real_data():
    c = cand(1, 0.01, epoch_steps=11, batch=128)
    assert brief_flags(c, 30) == ["--epochs", "1", "--synthetic-samples", str(128 * 30)]
    c["config"]["dataset"] = "digits"
    assert brief_flags(c, 30) == ["--epochs", "3", "--eval-every", "3"]  # 11 steps an epoch: 3 epochs


def test_a_short_step_is_measured_over_more_steps():
    # unfixed, a brief run takes TIMED_S (2 s) of its predicted steps, at least STEPS (30)
    assert steps_for(cand(1, 0.010), None) == 200  # a 10-ms step: 200 steps
    assert steps_for(cand(1, 0.250), None) == 30  # a 250-ms one: the floor
    assert steps_for(cand(1, 0.010), 12) == 12  # --validate-steps fixes it
    assert brief_flags(cand(1, 0.010, batch=128), None) == ["--epochs", "1", "--synthetic-samples", str(128 * 200)]
    assert steps_said(None) == "about 2 s of steps (at least 30)" and steps_said(12) == "12 steps"


def test_axes_narrowed_to_the_values_asked():
    req = Request(model="lenet5", nodes=1, nproc=2, only={"strategy": ("ring", "fsdp"), "precision": ("fp32",),
                                                          "workers": (0,), "compress": ("none",)})
    by = {g["strategy"][0]: g for g in grids(req, "cpu", 2)}
    assert set(by) == {"ring", "fsdp"} and by["ring"]["precision"] == ["fp32"] and by["fsdp"]["workers"] == [0]


PLAN = ("plan", "--model", "lenet5", "--nodes", "1", "--nproc", "2", "--batch-size", "64", "--dataset", "digits")


@pytest.mark.parametrize("flags,words", [
    (["--hardware", "dgx-a100-80gb", "--validate", "2"], ["data-sheet plan", "--calibration"]),
    (["--hardware", "dgx-a100-80gb", "--repeats", "2"], ["--repeats 2", "add --validate"]),
    (["--hardware", "dgx-a100-80gb", "--validate", "0"], ["--validate 0", "at least 1"]),
    (["--hardware", "dgx-a100-80gb", "--validate", "some"], ["--validate 'some'", "all"]),
    (["--hardware", "dgx-a100-80gb", "--strategy", "ps-async"], ["ps-async", "does not search it"]),
    (["--hardware", "dgx-a100-80gb", "--strategy", "rign"], ["rign", "must be one of"]),
    (["--hardware", "dgx-a100-80gb", "--workers", "0,x"], ["--workers", "not an integer"]),
])
def test_what_cannot_be_validated_or_searched_is_refused_in_one_line(tmp_path, capsys, flags, words):
    assert main([*PLAN, *flags, "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and all(w in err for w in words), err
    assert not (tmp_path / "p").exists()


@pytest.mark.slow
def test_validate_runs_the_top_candidates_and_train_plan_runs_the_chosen(tmp_path, capsys):
    from scaletrain.predict import calibration
    from predict_fixtures import fake_calibration

    cal = calibration.save(fake_calibration(threads=(1,)), tmp_path / "cal.json")
    out = tmp_path / "p"
    assert main([*PLAN, "--calibration", str(cal), "--time-ops", "off", "--strategy", "allreduce,ring",
                 "--precision", "fp32", "--workers", "0", "--checkpoint-activations", "none", "--compress", "none",
                 "--validate", "all", "--repeats", "2", "--validate-steps", "12", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    plan = json.loads((out / "plan.json").read_text())
    v = plan["validation"]
    assert len(plan["ranked"]) == 2 and v["repeats"] == 2 and not v["failed"]
    assert sorted(v["measured_order"]) == sorted(c["id"] for c in plan["ranked"])
    for row in v["candidates"]:
        assert row["runs"] == 2 and row["measured"]["step_time_s"] > 0
        assert row["ratio_to_chosen"]["rounds"] == 2
    for rank in (1, 2):
        for k in (0, 1):
            summary = json.loads((out / "validation" / f"c{rank}" / f"r{k}" / "summary.json").read_text())
            assert summary["status"] == "completed" and summary["world_size"] == 2
            assert summary["steps"] >= 12  # digits at global batch 128: 12 steps an epoch... at least the steps asked
    assert "validation: " in text and "measured on this machine" in (out / "report.html").read_text()
    # the chosen one runs again from the plan, as validated
    assert main(["train", "--plan", str(out), "--epochs", "1", "--out", str(tmp_path / "run")]) == 0
    ran = json.loads((tmp_path / "run" / "summary.json").read_text())
    want = plan["ranked"][chosen_rank(plan) - 1]["config"]
    assert ran["world_size"] == 2 and ran["global_batch"] == 2 * want["batch_size"]


@pytest.mark.parametrize("flags,words", [
    (["--testbed"], ["no testbed is up", "testbed up"]),
    (["--cores-per-host", "1"], ["--cores-per-host 1", "add --testbed"]),
    (["--testbed", "--link", "1gbit"], ["--link", "drop --link"]),
])
def test_a_testbed_plan_needs_the_testbed(tmp_path, capsys, monkeypatch, flags, words):
    monkeypatch.setenv("SCALETRAIN_TESTBED_STATE", str(tmp_path / "none.json"))  # no testbed up, whatever this machine
    assert main([*PLAN, "--calibration", "none.json", *flags, "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and all(w in err for w in words), err


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
                    reason="the testbed needs root and iproute2")
def test_a_testbed_plan_is_validated_on_its_hosts(tmp_path):
    from conftest import assert_ok, scaletrain
    from scaletrain.predict import calibration
    from predict_fixtures import fake_calibration

    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    if any(line.startswith("st-") for line in listed.splitlines()):
        pytest.skip("a testbed is already up on this machine; not touching it")
    env = {"SCALETRAIN_TESTBED_STATE": str(tmp_path / "testbed.json")}
    cal = calibration.save(fake_calibration(threads=(1,)), tmp_path / "cal.json")
    out = tmp_path / "p"
    try:
        assert_ok(scaletrain("testbed", "up", "--hosts", "2", "--rate", "100mbit", env=env))
        assert_ok(scaletrain("plan", "--model", "lenet5", "--nproc", "1", "--testbed", "--calibration", str(cal),
                             "--time-ops", "off", "--batch-size", "64", "--dataset", "digits", "--strategy",
                             "allreduce,ring", "--precision", "fp32", "--workers", "0", "--checkpoint-activations",
                             "none", "--compress", "none", "--validate", "all", "--repeats", "1",
                             "--validate-steps", "12", "--out", str(out), env=env, timeout=600))
    finally:
        scaletrain("testbed", "down", env=env)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["request"]["nodes"] == 2 and plan["request"]["testbed"] and plan["request"]["cores_per_host"] >= 1
    assert not plan["validation"]["failed"] and len(plan["validation"]["measured_order"]) == 2
    for rank in (1, 2):
        summary = json.loads((out / "validation" / f"c{rank}" / "r0" / "summary.json").read_text())
        assert summary["world_size"] == 2 and summary["testbed"]  # one rank on each host, across the shaped link
