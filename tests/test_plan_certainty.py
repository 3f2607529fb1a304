"""How sure a plan is: the candidates priced within the model's own error of the chosen one are counted, named in a
caveat with the command that measures them, and `--validate auto` runs exactly those."""

import json

from scaletrain.cli import main
from scaletrain.plan.certainty import BAND, caveat, uncertain


def ranked(*times):
    return [{"id": f"c{i}", "time_to_train_s": t} for i, t in enumerate(times, 1)]


def test_the_band_counts_the_candidates_the_model_cannot_tell_apart():
    band = BAND["calibration"]
    assert uncertain(ranked(100.0, 100 * (1 + band) - 1e-9, 100 * (1 + band) + 1e-6, 200.0), "calibration") == \
        {"band": band, "count": 2}
    assert uncertain(ranked(100.0, 120.0), "datasheet")["count"] == 2  # a data sheet's band is wider
    assert uncertain(ranked(100.0, 120.0), "calibration")["count"] == 1
    assert uncertain([], "calibration")["count"] == 0


def test_the_caveat_says_how_to_settle_it_on_each_basis():
    assert caveat({"band": 0.15, "count": 1}, "calibration") is None  # nothing within the band: the model is sure
    here = caveat({"band": 0.15, "count": 3}, "calibration")
    assert "top 3" in here and "within 15%" in here and "--validate auto" in here
    there = caveat({"band": 0.25, "count": 4}, "datasheet")
    assert "slurm validate-plan DIR --top auto" in there and "all 4" in there
    assert "--validate" not in there.replace("validate-plan", "")


def test_a_plan_records_its_band_and_says_it(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["plan", "--model", "lenet5", "--nodes", "1", "--nproc", "2", "--hardware", "dgx-a100-80gb",
                 "--batch-size", "32,64", "--dataset", "digits", "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    sure = plan["uncertain"]
    assert sure["band"] == BAND["datasheet"]
    chosen = plan["ranked"][0]["time_to_train_s"]
    assert sure["count"] == sum(1 for c in plan["ranked"] if c["time_to_train_s"] <= chosen * (1 + sure["band"]))
    said = capsys.readouterr().out
    assert (f"the top {sure['count']} candidates are priced within 25%" in said) == (sure["count"] > 1)


def test_validate_auto_measures_the_candidates_within_the_band(tmp_path, monkeypatch, capsys):
    from predict_fixtures import fake_calibration

    from scaletrain.plan import cli as plan_cli
    from scaletrain.predict import calibration

    cal = calibration.save(fake_calibration(threads=(1,)), tmp_path / "cal.json")
    asked = []
    monkeypatch.setattr(plan_cli, "run_validation", lambda plan, out, k, args, console: asked.append(k))
    assert main(["plan", "--model", "lenet5", "--nodes", "1", "--nproc", "2", "--batch-size", "32,64",
                 "--dataset", "digits", "--calibration", str(cal), "--time-ops", "off", "--validate", "auto",
                 "--out", str(tmp_path / "p")]) == 0
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert plan["uncertain"]["band"] == BAND["calibration"] and asked == [plan["uncertain"]["count"]] and asked[0] >= 1
