"""validate/ratios.py: ratios of points that differ in one setting, measured side by side and predicted, the
repeats' spread beside every error, and the signs of the errors (a shared sign is a bias)."""

from __future__ import annotations

import pytest

from scaletrain.validate.match import MeasuredRun, error_summary, validate
from scaletrain.validate.ratios import ratios, signs, spread, summary


def _point(pid, nproc, batch, predicted_rate, **config):
    cfg = {"model": "lenet5", "dataset": "digits", "nproc": nproc, "batch_size": batch, "strategy": "allreduce",
           **config}
    return {"id": pid, "config": cfg, "step_time_s": batch * nproc / predicted_rate, "samples_per_s": predicted_rate}


def _runs(pid, nproc, batch, rates, **config):
    cfg = {"model": "lenet5", "dataset": "digits", "nproc": nproc, "batch_size": batch, "strategy": "allreduce",
           **config}
    return [MeasuredRun(f"{pid}-{k}", cfg, batch * nproc / r, samples_per_s=r, point=pid) for k, r in enumerate(rates)]


def test_a_ratio_cancels_a_drift_that_hides_the_absolute_error():
    """The machine ran 20% slow throughout: every absolute step time is off by the drift, every ratio is exact."""
    prediction = {"points": [_point("a", 1, 32, 1000.0), _point("b", 2, 32, 1800.0), _point("c", 1, 64, 1200.0)]}
    runs = (_runs("a", 1, 32, [800.0, 790.0, 810.0]) + _runs("b", 2, 32, [1440.0, 1430.0, 1450.0])
            + _runs("c", 1, 64, [960.0, 950.0, 970.0]))
    result = validate(prediction, runs)
    assert result["summary"]["median_abs_error"] == pytest.approx(0.2, abs=0.01)
    assert result["summary"]["biased"] is False  # three points: too few to call a bias
    by = {(r["axis"], r["to"]): r for r in result["ratios"]}
    assert set(by) == {("nproc", "b"), ("batch_size", "c")}
    assert by[("nproc", "b")]["measured"] == pytest.approx(1.8, rel=1e-3)
    assert by[("nproc", "b")]["error"] == pytest.approx(0.0, abs=2e-3)
    assert result["ratio_summary"]["median_abs_error"] < 0.005
    # each point's repeats spread 2.5% (max - min over mean), beside its error
    assert result["points"][0]["measured"]["spread"] == pytest.approx(20 / 800, rel=1e-3)
    assert result["summary"]["beyond_spread"] == 3 and result["summary"]["with_spread"] == 3


def test_a_wrong_speedup_shows_in_its_ratio_and_its_sign():
    prediction = {"points": [_point("a", 1, 32, 1000.0), _point("b", 2, 32, 2000.0)]}
    runs = _runs("a", 1, 32, [1000.0, 1000.0]) + _runs("b", 2, 32, [1500.0, 1500.0])
    (r,) = validate(prediction, runs)["ratios"]
    assert r["measured"] == pytest.approx(1.5) and r["predicted"] == pytest.approx(2.0)
    assert r["error"] == pytest.approx(1 / 3) and r["spread"] == 0.0


def test_repeats_of_one_round_pair_up_and_their_ratios_are_the_ratio_s_own_noise():
    """A study's rounds (r0, r1, ...) run every point side by side: the machine ran 20% slower in the second
    round, so each point's repeats spread 22%, yet within each round the speedup is exactly 1.5: paired, the
    ratio has no noise; one round's pair that disagrees shows as the ratio's spread."""
    def runs(pid, nproc, rates):
        cfg = {"model": "lenet5", "dataset": "digits", "nproc": nproc, "batch_size": 32, "strategy": "allreduce"}
        return [MeasuredRun(f"study/points/{pid}/r{k}", cfg, 32 * nproc / r, samples_per_s=r, point=pid)
                for k, r in enumerate(rates)]

    prediction = {"points": [_point("a", 1, 32, 1000.0), _point("b", 2, 32, 1500.0)]}
    (r,) = validate(prediction, runs("a", 1, [1000.0, 800.0]) + runs("b", 2, [1500.0, 1200.0]))["ratios"]
    assert r["pairs"] == 2 and r["measured"] == pytest.approx(1.5) and r["spread"] == pytest.approx(0.0)
    assert r["error"] == pytest.approx(0.0)
    (r,) = validate(prediction, runs("a", 1, [1000.0, 800.0, 1000.0]) + runs("b", 2, [1500.0, 1200.0, 1800.0]))["ratios"]
    mean = (1.5 * 1.5 * 1.8) ** (1 / 3)  # the rounds' ratios 1.5, 1.5, 1.8: their geometric mean
    assert r["pairs"] == 3 and r["measured"] == pytest.approx(mean) and r["spread"] == pytest.approx(0.3 / mean)
    # runs that are no study's rounds do not pair: the ratio of the means, the points' spreads combined
    (r,) = validate(prediction, _runs("a", 1, 32, [1000.0, 800.0]) + _runs("b", 2, 32, [1500.0, 1200.0]))["ratios"]
    assert r["pairs"] == 0 and r["spread"] == pytest.approx(2 ** 0.5 * 200 / 900, rel=1e-3)


def test_points_that_differ_in_two_settings_give_no_ratio():
    points = [{"id": "a", "config": {"nproc": 1, "batch_size": 32}, "measured": {"samples_per_s": 1.0},
               "predicted": {"samples_per_s": 1.0}},
              {"id": "b", "config": {"nproc": 2, "batch_size": 64}, "measured": {"samples_per_s": 2.0},
               "predicted": {"samples_per_s": 2.0}}]
    assert ratios(points) == []


def test_spread_and_signs():
    assert spread([1.0]) is None and spread([0.9, 1.1]) == pytest.approx(0.2)
    assert signs([0.1, 0.2, 0.05, 0.3]) == {"over": 4, "under": 0, "biased": True}
    assert signs([0.1, -0.2, 0.05, 0.3])["biased"] is False
    s = error_summary([0.1, -0.05], [0.2, 0.01])
    assert s["beyond_spread"] == 1 and s["with_spread"] == 2 and s["median_spread"] == pytest.approx(0.105)
    assert summary([])["count"] == 0


def test_recorded_held_out_runs_give_their_ratio_and_spread_figures():
    """tests/data/heldout-2026-11-25: lenet5 and resnet20 (which no calibration reference network is) x 1-2 ranks
    x batch 32/64, 3 interleaved repeats each, measured here, and their prediction from a full calibration of
    this machine made that day (docs/predict-validation.md). The figures the closing note quotes."""
    from pathlib import Path

    from scaletrain.validate import load_measured, load_prediction

    data = Path(__file__).parent / "data" / "heldout-2026-11-25"
    result = validate(load_prediction(data), load_measured([data / "study"], []))
    assert len(result["points"]) == 8 and all(p["measured"]["repeats"] == 3 for p in result["points"])
    s, r = result["summary"], result["ratio_summary"]
    assert s["median_abs_error"] == pytest.approx(0.093, abs=0.001) and s["median_spread"] == pytest.approx(0.233, abs=0.001)
    assert (s["over"], s["under"]) == (5, 3)
    # each ratio from its rounds side by side (r0 with r0, ...): their geometric mean, and their spread
    assert r["count"] == 12 and r["median_abs_error"] == pytest.approx(0.097, abs=0.001)
    assert (r["over"], r["under"]) == (10, 2) and r["by_axis"]["nproc"]["over"] == 4  # every speedup too optimistic
    assert r["beyond_spread"] == 3 and r["with_spread"] == 12
    assert all(x["pairs"] == 3 for x in result["ratios"])


def _paired(pid, nproc, rates, model="lenet5"):
    cfg = {"model": model, "dataset": "digits", "nproc": nproc, "batch_size": 32, "strategy": "allreduce"}
    return [MeasuredRun(f"study/points/{pid}/r{k}", cfg, 32 * nproc / r, samples_per_s=r, point=pid)
            for k, r in enumerate(rates)]


def test_a_ratio_s_rounds_give_its_standard_error_and_an_error_beyond_it_is_counted():
    """The rounds' ratios 1.5, 1.5, 1.8: the standard error of their (log) mean is stdev / sqrt(3); a prediction
    of 1.6 errs within twice that, one of 2.0 beyond it."""
    import math
    import statistics

    runs = _paired("a", 1, [1000.0, 800.0, 1000.0]) + _paired("b", 2, [1500.0, 1200.0, 1800.0])
    logs = [math.log(1.5), math.log(1.5), math.log(1.8)]
    want = statistics.stdev(logs) / math.sqrt(3)
    for predicted, beyond in ((1600.0, 0), (2000.0, 1)):
        result = validate({"points": [_point("a", 1, 32, 1000.0), _point("b", 2, 32, predicted)]}, runs)
        (r,) = result["ratios"]
        assert r["standard_error"] == pytest.approx(want)
        s = result["ratio_summary"]
        assert (s["beyond_noise"], s["with_noise"]) == (beyond, 1)
    # runs that are no study's rounds have no standard error, and count for neither
    (r,) = validate({"points": [_point("a", 1, 32, 1000.0), _point("b", 2, 32, 1500.0)]},
                    _runs("a", 1, 32, [1000.0, 800.0]) + _runs("b", 2, 32, [1500.0, 1200.0]))["ratios"]
    assert r["standard_error"] is None


def test_the_noise_floor_is_what_an_exact_model_would_err_by_from_the_rounds_noise():
    """Over many ratios of standard error s, an exact model's |errors| are |N(0, s)| (log-normal): their median
    0.674 s and their p90 1.645 s, nearly; over one, its |error|'s mean, 0.798 s; none without rounds; half the
    noise, half the floor."""
    from scaletrain.validate.ratios import noise_floor

    f = noise_floor([0.02] * 200)
    assert f["noise_median_abs_error"] == pytest.approx(0.6745 * 0.02, rel=0.03)
    assert f["noise_p90_abs_error"] == pytest.approx(1.645 * 0.02, rel=0.03)
    assert noise_floor([0.02])["noise_median_abs_error"] == pytest.approx(0.798 * 0.02, rel=0.03)
    assert noise_floor([]) == {"noise_median_abs_error": None, "noise_p90_abs_error": None}
    twelve = noise_floor([0.03] * 12)["noise_median_abs_error"]
    assert noise_floor([0.03 / 2] * 12)["noise_median_abs_error"] == pytest.approx(twelve / 2, rel=0.05)
    assert noise_floor([0.02]) == noise_floor([0.02])  # seeded: the same figures every time


def test_the_ratio_line_says_how_many_err_beyond_the_noise_and_what_the_noise_alone_would_show():
    from scaletrain.validate.output import ratio_line, ratio_table

    runs = _paired("a", 1, [1000.0, 800.0, 1000.0]) + _paired("b", 2, [1500.0, 1200.0, 1800.0])
    result = validate({"points": [_point("a", 1, 32, 1000.0), _point("b", 2, 32, 2000.0)]}, runs)
    line = ratio_line(result)
    assert "1 of 1 beyond the rounds' noise, which alone would show median " in line and "p90 " in line
    assert ratio_table(result).rows[0][-1].endswith("%")


def test_reproducibility_sets_the_machine_s_own_repeatability_beside_the_model():
    """Three studies measured one speedup 1.2, 1.5 and 1.35 (the model predicted 1.35 each time): between two
    studies it differs 20%, 11.1% and 11.1% (one over the other, minus 1); each study's oracle is the other two's
    geometric mean."""
    from scaletrain.validate.ratios import reproducibility

    def rows(measured):
        return [{"axis": "nproc", "from": "a", "to": "b", "measured": measured, "error": 1.35 / measured - 1}]

    r = reproducibility({"s1": rows(1.2), "s2": rows(1.5), "s3": rows(1.35)})
    assert r["between"]["count"] == 3
    assert r["between"]["median"] == pytest.approx(1 - 1.2 / 1.35) and r["between"]["p90"] > 0.18
    oracle = r["studies"]["s1"]["oracle"]
    assert oracle["count"] == 1 and oracle["median"] == pytest.approx((1.5 * 1.35) ** 0.5 / 1.2 - 1)
    assert r["studies"]["s3"]["model"]["median"] == pytest.approx(0.0)
    assert r["studies"]["s3"]["oracle"]["median"] == pytest.approx(abs((1.2 * 1.5) ** 0.5 / 1.35 - 1))
    # a ratio only one study measured has no oracle
    lone = reproducibility({"s1": rows(1.2), "s2": [{**rows(1.5)[0], "to": "c"}]})
    assert lone["between"]["count"] == 0 and lone["studies"]["s1"]["oracle"]["count"] == 0
