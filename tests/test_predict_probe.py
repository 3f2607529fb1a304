"""The speed probe: the machine's speed now against when it was calibrated (predict/probe.py)."""

from __future__ import annotations

import pytest

from predict_fixtures import NETWORK, calibrated_here, fake_calibration
from scaletrain.errors import UserError
from scaletrain.predict import probe
from scaletrain.predict.points import Predictor


def test_the_probe_times_the_reference_step():
    t = probe.probe_s(1, seconds=0.05)
    assert 1e-4 < t < 5.0


def test_off_probes_nothing_and_auto_says_why_it_cannot():
    cal = fake_calibration()
    assert probe.speed_now(cal, "off") is None
    auto = probe.speed_now(cal, "auto")
    assert auto["applied"] is False and "no speed probe" in auto["why"]
    with pytest.raises(UserError, match="--probe on"):
        probe.speed_now(cal, "on")
    elsewhere = calibrated_here(cal)
    elsewhere["device"]["host"] = "another-node"
    assert "another machine" in probe.speed_now(elsewhere, "auto")["why"]


def test_a_machine_twice_as_slow_now_doubles_the_calibrated_compute(monkeypatch):
    cal = calibrated_here(fake_calibration())
    monkeypatch.setattr(probe, "measure", lambda threads, device=None, seconds=0.5: {"1": 0.2, "2": 0.1})
    result = probe.speed_now(cal, "auto")
    assert result["applied"] and result["threads"]["2"]["ratio"] == pytest.approx(2.0)
    from scaletrain.predict.ops import trace_ops
    from scaletrain.predict.refnet import build

    w = trace_ops(build(10, 3, 32), (3, 32, 32), 16)
    plain, slow = Predictor(cal, NETWORK), Predictor(cal, NETWORK, probe=result)
    a, b = plain.op_costs(w, "fp32", 2), slow.op_costs(w, "fp32", 2)
    assert sum(o.forward_s for o in b) == pytest.approx(2 * sum(o.forward_s for o in a))
    assert slow.loss_s(16, 10, "fp32", 2)[1] == pytest.approx(2 * plain.loss_s(16, 10, "fp32", 2)[1])
    assert slow.optimizer_law("sgd", 2)(10, 1000) == pytest.approx(2 * plain.optimizer_law("sgd", 2)(10, 1000))
    assert slow.loop(1) == plain.loop(1)  # the loop factor is the calibration's own, probed or not


def test_a_calibration_made_while_the_machine_sped_up_and_slowed_down_is_flagged(tmp_path):
    from scaletrain.predict.calibration import unsteady
    from scaletrain.predict.scaling import predict_grid
    from scaletrain.study.grid import StudySpec

    cal = fake_calibration()
    assert unsteady(cal) is None
    cal["probe"] = {"spread": {"1": 0.05, "2": 0.43}}
    assert "moved 43%" in unsteady(cal)
    assert unsteady(cal, threads=1) is None and "moved 43%" in unsteady(cal, threads=2)
    spec = StudySpec(axes={"nproc": [1]}, train={"model": "lenet5", "dataset": "synthetic"}, repeats=1)
    notes = predict_grid(spec, cal, NETWORK, None, "test")["notes"]
    assert any("calibrate again when the machine is quieter" in n for n in notes)
