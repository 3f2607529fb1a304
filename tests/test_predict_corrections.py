"""Each correction the calibration basis stacks on the ops' isolated times earns its place (issue 24: "each one
that stays must show, in a test or the validation, what removing it costs").

tests/data/corrections-2026-11-26: a full calibration of this 2-core VM (2026-11-26 03:47) and two studies run
after it with 3 interleaved repeats: lenet5 and resnet20 (neither a reference network of the calibration) x
1-2 ranks x batch 32/64 at one thread per rank (ho-study2), and the same models x 1-2 ranks at two threads
per rank (corr-threads2: two ranks oversubscribe the two cores). Each correction is left out in turn
(predict/ablation.py, as benchmarks/corrections.py does) and the error of the phases it prices is compared
with and without it. Recorded runs and one calibration: deterministic, no timing here."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from scaletrain.errors import UserError
from scaletrain.predict.predictor import CORRECTIONS, Predictor

DATA = Path(__file__).parent / "data" / "corrections-2026-11-26"
HELD_OUT, THREADS = str(DATA / "ho-study2"), str(DATA / "corr-threads2")


def _validated(data: Path, studies, without=(), shapes: bool = False):
    """The validation of `data`'s recorded studies, predicted from its calibration with the corrections `without`
    left out (with `shapes`: the op shapes recorded beside it, none timed here)."""
    import contextlib
    import io

    from scaletrain.predict import calibration
    from scaletrain.predict.cli import predict_spec
    from scaletrain.predict.scaling import predict_grid
    from scaletrain.predict.shapes import OpShapes
    from scaletrain.validate.load import load_measured
    from scaletrain.validate.match import validate

    cal = calibration.load(data / "calibration.json")
    network = {"intra": cal["network"]["fits"], "inter": None, "source": "calibration"}
    timer = OpShapes(cal, data / "shapes.json", budget_s=0.0) if shapes else None
    with contextlib.redirect_stdout(io.StringIO()):
        prediction = predict_grid(predict_spec(str(data / studies[0] / "study.toml"), {}, {}), cal, network, None,
                                  "recorded", shapes=timer, without=frozenset(without))
    return validate(prediction, load_measured([data / s for s in studies]))


@pytest.fixture(scope="module")
def rows():
    from scaletrain.predict.ablation import ablation

    return {r["without"]: r for r in ablation(DATA / "calibration.json", [HELD_OUT, THREADS])}


def _phase(rows, name, study):
    v = rows[name]["studies"][study]
    return v["phase_error_with"], v["phase_error"]


@pytest.mark.parametrize("name, study", [
    ("group_factors", "ho-study2"), ("group_bound", "ho-study2"), ("optimizer_residual", "ho-study2"),
    ("loop_overheads", "ho-study2"), ("comm_residual", "ho-study2"), ("comm_slope", "ho-study2"),
    ("core_stretch", "corr-threads2"),
])
def test_leaving_a_correction_out_makes_the_phases_it_prices_worse(rows, name, study):
    with_it, without = _phase(rows, name, str(DATA / study))
    assert without > with_it, f"{name}: its phases' median |error| {with_it:.1%} with it, {without:.1%} without"


def test_leaving_out_the_slowdown_of_two_ranks_worsens_the_ratios_measured_side_by_side(rows):
    """The 1-to-2-rank speedups: without the slowdown of a rank on a full machine every ratio is further off."""
    for study in (HELD_OUT, THREADS):
        with_it = rows[None]["studies"][study]["ratios"]["median_abs_error"]
        # (7.8% -> 8.4% and 111% -> 119% since convolutions are priced at their own output, 2026-11-27)
        assert rows["rank_slowdown"]["studies"][study]["ratios"]["median_abs_error"] > with_it + 0.005


def test_a_correction_the_runs_do_not_exercise_changes_nothing(rows):
    """The held-out study runs no loader workers: leaving out the workers' corrections predicts the same."""
    base = rows[None]["studies"][HELD_OUT]["predicted_s"]
    assert rows["loader_handoff"]["studies"][HELD_OUT]["predicted_s"] == pytest.approx(base, rel=1e-12)
    assert rows["rank_slowdown"]["studies"][HELD_OUT]["predicted_s"] != pytest.approx(base, rel=1e-6)


def test_an_unknown_correction_is_one_line_naming_them_all():
    with pytest.raises(UserError, match="no correction named loop_factor: the corrections are loop_factors"):
        Predictor({"device": {"cores": 2}}, {}, without=frozenset({"loop_factor"}))
    assert len(CORRECTIONS) == 22


def test_oversubscribed_thread_teams_are_flagged_not_priced():
    """Two ranks of two threads on two cores measured 2-16x slower than the stretch by threads / cores: such a
    point is flagged (the step time a floor), and one thread per rank, time-sliced, is not."""
    import contextlib
    import io

    from scaletrain.predict import calibration
    from scaletrain.predict.cli import predict_spec
    from scaletrain.predict.scaling import predict_grid
    from scaletrain.validate.load import load_measured
    from scaletrain.validate.match import validate

    cal = calibration.load(DATA / "calibration.json")
    network = {"intra": cal["network"]["fits"], "inter": None, "source": "calibration"}
    with contextlib.redirect_stdout(io.StringIO()):
        prediction = predict_grid(predict_spec(str(DATA / "corr-threads2" / "study.toml"), {}, {}), cal, network,
                                  None, "recorded")
        single = predict_grid(predict_spec(str(DATA / "ho-study2" / "study.toml"), {}, {}), cal, network, None, "")
    flags = {p["id"]: p["plausibility"]["flag"] for p in prediction["points"]}
    assert [k for k, f in flags.items() if f] == ["nproc2-model_lenet5", "nproc2-model_resnet20"]
    assert "4 intra-op threads on 2 cores" in flags["nproc2-model_resnet20"]
    assert not any(p["plausibility"]["flag"] for p in single["points"])  # 2 ranks x 1 thread: priced
    measured = validate(prediction, load_measured([DATA / "corr-threads2"]))["points"]
    assert all(p["measured"]["step_time_s"] > 1.9 * p["predicted"]["step_time_s"]
               for p in measured if p["config"]["nproc"] == 2)


def test_the_held_out_models_as_recorded_are_predicted_within_the_targets_medians():
    """The model as it is, against the held-out study with 3x longer runs (tests/data/corrections-2026-11-26/
    ho-study3: lenet5 and resnet20 x 1-2 ranks x batch 32/64, 3 interleaved repeats, 2026-11-26) from the
    calibration made before it: the figures the closing note quotes, held so that a change of the model that
    makes them worse fails here. By the calibrated laws alone (this calibration's machine moved 28% while it was
    calibrated: no shape is timed for it): step time 5.3% / 10.7%, ratios 7.7% / 11.9% since each convolution is
    priced at the output it makes (LeNet's unpadded ones were priced at "same" padding: 4.9% / 20.2%, 4.8% /
    16.1%)."""
    import contextlib
    import io

    from scaletrain.predict import calibration
    from scaletrain.predict.cli import predict_spec
    from scaletrain.predict.scaling import predict_grid
    from scaletrain.validate.load import load_measured
    from scaletrain.validate.match import validate

    cal = calibration.load(DATA / "calibration.json")
    network = {"intra": cal["network"]["fits"], "inter": None, "source": "calibration"}
    with contextlib.redirect_stdout(io.StringIO()):
        prediction = predict_grid(predict_spec(str(DATA / "ho-study3" / "study.toml"), {}, {}), cal, network,
                                  None, "recorded")
    v = validate(prediction, load_measured([DATA / "ho-study3"]))
    step, ratios = v["summary"], v["ratio_summary"]
    assert step["count"] == 8 and ratios["count"] == 12
    assert step["median_abs_error"] <= 0.06 and ratios["median_abs_error"] <= 0.08
    assert step["p90_abs_error"] <= 0.12 and ratios["p90_abs_error"] <= 0.13
    assert ratios["by_axis"]["batch_size"]["median_abs_error"] <= 0.05


# A steady full calibration (2026-11-27 09:25, its probes spread 1.2%), the 84 op shapes of the held-out grid that
# `predict` timed right after it (its op-shapes cache, predict/shapes.py), and two held-out studies run after it
# (ho-study7, ho-study8: lenet5 and resnet20 x 1-2 ranks x batch 32/64, one thread per rank, runs 3x longer,
# 3 interleaved repeats each).
TODAY = Path(__file__).parent / "data" / "heldout-2026-11-27"


def _today(shapes, data=None, studies=("ho-study7", "ho-study8")):
    """The step-time and ratio summaries of `data`'s studies, pooled, predicted from its calibration with the
    shapes `shapes(cal)` gives (None: the laws); nothing is timed here."""
    import contextlib
    import io

    from scaletrain.predict import calibration
    from scaletrain.predict.cli import predict_spec
    from scaletrain.predict.scaling import predict_grid
    from scaletrain.validate.load import load_measured
    from scaletrain.validate.match import validate

    data = data or TODAY
    cal = calibration.load(data / "calibration.json")
    network = {"intra": cal["network"]["fits"], "inter": None, "source": "calibration"}
    timer = shapes(cal)
    with contextlib.redirect_stdout(io.StringIO()):
        prediction = predict_grid(predict_spec(str(data / studies[0] / "study.toml"), {}, {}), cal, network, None,
                                  "recorded", shapes=timer)
    # nothing timed here (on TODAY the in-place ReLUs, recorded before they were timed in place, keep their rows)
    assert timer is None or timer.timed == 0
    v = validate(prediction, load_measured([data / s for s in studies]))
    return v["summary"], v["ratio_summary"]


def test_the_held_out_models_with_their_own_shapes_timed_meet_the_targets_as_recorded():
    """With the shapes timed (6 repeats a point pooled): step time 3.9% median, 9.0% p90 (5 over, 3 under), ratios
    4.5% / 12.8% (6 over, 6 under); by the laws alone 11.9% / 14.4% and 7.1% / 20.1%: the law's error on
    ResNet-20's few convolution shapes (+22% in backward) was the largest error left. (Read with the communication
    line through every repeat: this calibration ran one repeat at batch 8, and its median at 32 moved to the mean.
    Before the residual's floor, 2026-11-29: 5.0% / 9.0%, 4.8% / 15.2%; laws 12.2% / 16.4%, 9.3% / 21.8%.)"""
    from scaletrain.predict.shapes import OpShapes

    step, ratios = _today(lambda cal: OpShapes(cal, TODAY / "shapes.json", budget_s=0.0))
    assert step["median_abs_error"] <= 0.045 and step["p90_abs_error"] <= 0.10 and not step["biased"]
    assert ratios["median_abs_error"] <= 0.05 and ratios["p90_abs_error"] <= 0.135 and not ratios["biased"]
    laws_step, laws_ratios = _today(lambda cal: None)
    assert laws_step["median_abs_error"] > step["median_abs_error"] + 0.05
    assert laws_ratios["median_abs_error"] > ratios["median_abs_error"] + 0.02


def test_the_residuals_floor_brings_the_held_out_short_steps_closer_as_recorded():
    """LeNet-5's 2-rank steps are short (a few ms of compute): the reference runs' line prices their exposed
    communication at a fraction of the wait one collective between computing ranks takes (this calibration's halo
    fit: 1.7 ms beyond the idle point-to-point's). Without the floor the same study's step time is 5.0% / 9.0% and
    its ratios 4.8% / 15.2% (median / p90), with it 3.9% / 9.0% and 4.5% / 12.8%; the afternoon's calibration,
    whose line is above the floor, predicts the same either way."""
    def summaries(data, studies, without):
        v = _validated(data, studies, without, shapes=True)
        return v["summary"], v["ratio_summary"]

    (step, ratios), (step_off, ratios_off) = (summaries(TODAY, ("ho-study7", "ho-study8"), w)
                                              for w in ((), {"skew_floor"}))
    assert step_off["median_abs_error"] > step["median_abs_error"] + 0.01
    assert ratios_off["p90_abs_error"] > ratios["p90_abs_error"] + 0.02
    afternoon = ("ho-s12a", "ho-s12b", "ho-s12c")
    assert summaries(AFTERNOON, afternoon, ()) == summaries(AFTERNOON, afternoon, {"skew_floor"})


# The same grid in the afternoon (2026-11-27): a full calibration (12:32-12:40) with refnet's two-rank runs at batch
# 8 four times, alternated with the slowdown pair and the runs at batch 32, and max pooling timed on a rectified
# field; the 76 op shapes `predict` timed right after it; three held-out studies of 3 interleaved repeats, one
# before it (ho-s12a, 12:16), one right after (ho-s12b, 12:40) and one after another calibration (ho-s12c, 12:57).
AFTERNOON = Path(__file__).parent / "data" / "heldout-2026-11-27b"


def test_the_held_out_ratios_meet_their_targets_as_recorded_in_the_afternoon():
    """Pooled (9 repeats a point): step time 3.0% median, 6.3% p90 (1 over, 7 under), ratios 3.5% / 6.0% (9 over, 3
    under; every 1-to-2-rank speedup within 6.2%): the ratio targets (median 5%, p90 10%, both signs) met. The
    morning's calibration (one run at batch 8, max pooling timed on normal numbers) left LeNet-5's speedups 16-18%
    and its step 8-11% high."""
    from scaletrain.predict.shapes import OpShapes

    step, ratios = _today(lambda cal: OpShapes(cal, AFTERNOON / "shapes.json", budget_s=0.0), AFTERNOON,
                          ("ho-s12a", "ho-s12b", "ho-s12c"))
    assert step["median_abs_error"] <= 0.05 and step["p90_abs_error"] <= 0.10
    assert ratios["median_abs_error"] <= 0.05 and ratios["p90_abs_error"] <= 0.10 and not ratios["biased"]
    assert ratios["by_axis"]["nproc"]["p90_abs_error"] <= 0.07


# A full calibration made with the slowdown pair alternated and the harness measured (runs/cal-full7, 2026-11-26
# 11:53), and the held-out study run right after it (runs/ho-study6: lenet5 and resnet20 x 1-2 ranks x batch
# 32/64, one thread per rank, runs 3x longer, 3 interleaved repeats).
LATER = Path(__file__).parent / "data" / "heldout-2026-11-26b"


@pytest.fixture(scope="module")
def later_rows():
    from scaletrain.predict.ablation import ablation

    return {r["without"]: r for r in ablation(LATER / "calibration.json", [str(LATER / "ho-study6")])}


def test_the_slowdown_measured_by_alternated_rounds_is_what_the_held_out_speedups_need(later_rows):
    """The 1-to-2-rank slowdown from 4 alternated rounds (x1.15 forward, x1.10 backward here): without it the
    held-out ratios are 4 points further off and the compute phases 5 points."""
    study = str(LATER / "ho-study6")
    base, off = later_rows[None]["studies"][study], later_rows["rank_slowdown"]["studies"][study]
    assert off["ratios"]["median_abs_error"] > base["ratios"]["median_abs_error"] + 0.02
    assert off["phase_error"] > off["phase_error_with"] + 0.03


def test_the_harness_is_taken_off_each_op_and_is_small_beside_large_ops(later_rows):
    """Taking what timing an op alone adds off each op (38 us backward, 4 us forward per op in this calibration)
    moves the held-out predictions a little and the small model's most: lenet5 by more than resnet20."""
    study = str(LATER / "ho-study6")
    with_it, without = later_rows[None]["studies"][study], later_rows["harness_excess"]["studies"][study]
    assert with_it["ids"] == without["ids"] and len(with_it["ids"]) == 8
    change = {k: b / a - 1 for k, a, b in zip(with_it["ids"], with_it["predicted_s"], without["predicted_s"])}
    assert all(c > 0 for c in change.values())
    assert min(c for k, c in change.items() if "lenet5" in k) > max(c for k, c in change.items() if "resnet20" in k)


# Precision, held out (2026-11-27 13:04-13:09: resnet20 and lenet5 in fp32 and bf16, one rank of one thread, batch
# 32, 3 interleaved repeats), predicted from a full calibration made right after it (13:10-13:18) that times every op
# under bf16 on bf16 inputs, as the op before it hands them over (`op_inputs`: autocast), with the 110 shapes
# `predict` timed for the study.
PRECISION = Path(__file__).parent / "data" / "precision-2026-11-27"


def test_the_held_out_precision_ratios_as_recorded():
    """Ratios 3.0% median, 5.9% p90 (fp32 over bf16 samples per second: ResNet-20 -1.5%, LeNet-5 -7.2%), step time
    4.3% / 7.1%. The two calibrations before it, which timed ops under bf16 on fp32 inputs, put ResNet-20's ratio
    +16% and +17% (its batch norms priced at their fp32 time, 4.6x what they took on bf16)."""
    from scaletrain.predict.shapes import OpShapes

    step, ratios = _today(lambda cal: OpShapes(cal, PRECISION / "shapes.json", budget_s=0.0), PRECISION,
                          ("prec-s12",))
    assert ratios["median_abs_error"] <= 0.05 and ratios["p90_abs_error"] <= 0.08
    assert ratios["by_axis"]["precision"]["p90_abs_error"] <= 0.08
    assert step["median_abs_error"] <= 0.06 and step["p90_abs_error"] <= 0.10


# Loader workers, held out (2026-11-27, thirteenth session): a full calibration that measures a worker's hand-over
# against the same batches made in process and the rank's taking of a made batch (15:18-15:26), the op shapes
# `predict` timed right after it, and a study run after that: LeNet-5 and dwnet (benchmarks/validation_models.py)
# x 1-2 ranks of one thread x 0-2 workers, batch 64, on a JPEG folder written from digits at 128 px, read at 32 px
# (3 interleaved repeats). Neither the batch, dwnet nor the folder's size was among the runs the model was built on.
WORKERS = Path(__file__).parent / "data" / "workers-2026-11-27"


@pytest.fixture(scope="module")
def digits_128(tmp_path_factory):
    """The study's image folder, written again where its study.toml names it (runs/digits-128, relative)."""
    from scaletrain.data import write_imagefolder

    root = tmp_path_factory.mktemp("workers")
    write_imagefolder(source="digits", out=root / "runs" / "digits-128", image_size=128, copies=2, seed=0, quality=90)
    return root


def test_the_held_out_loader_worker_ratios_as_recorded(digits_128, monkeypatch):
    """Ratios 4.6% median, 9.2% p90 (6 over, 14 under); the 8 worker ratios 3.6% / 4.7%, the 1-to-2-rank speedups
    4.6% / 6.9%; step time 8.8% / 17.3% (dwnet's backward priced 27% over: its ops' isolated backward sum is above
    its measured phase). Before the model of predict/workers.py the worker ratios of such runs were off by -36% to
    +12% (2026-11-27, docs/predict-validation.md). Without the worker's share of the rank's cores (`worker_sharing`)
    the worker ratios' p90 is 37%; with LeNet-5's images priced at their whole 128 px where `--no-augment` decodes
    them at 64 (JPEG draft), its steps were 14-33% over."""
    import sys

    from scaletrain.predict.shapes import OpShapes

    monkeypatch.chdir(digits_128)
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))  # validation_models:dwnet
    sys.modules.pop("validation_models", None)

    def today(without=frozenset()):
        import contextlib
        import io

        from scaletrain.predict import calibration
        from scaletrain.predict.cli import predict_spec
        from scaletrain.predict.scaling import predict_grid
        from scaletrain.validate.load import load_measured
        from scaletrain.validate.match import validate

        cal = calibration.load(WORKERS / "calibration.json")
        network = {"intra": cal["network"]["fits"], "inter": None, "source": "calibration"}
        shapes = OpShapes(cal, WORKERS / "shapes.json", budget_s=0.0)
        with contextlib.redirect_stdout(io.StringIO()):
            prediction = predict_grid(predict_spec(str(WORKERS / "ws-s13c" / "study.toml"), {}, {}), cal, network,
                                      None, "recorded", shapes=shapes, without=without)
        assert shapes.timed == 0
        v = validate(prediction, load_measured([WORKERS / "ws-s13c"]))
        return v["summary"], v["ratio_summary"]

    step, ratios = today()
    assert step["count"] == 12 and ratios["count"] == 20
    assert ratios["median_abs_error"] <= 0.05 and ratios["p90_abs_error"] <= 0.10 and not ratios["biased"]
    workers = ratios["by_axis"]["workers"]
    assert workers["median_abs_error"] <= 0.05 and workers["p90_abs_error"] <= 0.06
    assert ratios["by_axis"]["nproc"]["p90_abs_error"] <= 0.08
    assert step["median_abs_error"] <= 0.10
    _, unshared = today(frozenset({"worker_sharing"}))
    assert unshared["by_axis"]["workers"]["p90_abs_error"] > 0.2


# The exposed all-reduce priced apart (2026-11-29, twenty-fourth session): a full calibration with DDP's copies timed
# and each collective's CPU fitted (runs/cal-s24, its 2-thread probes spread 55%: the 1-thread grid these one-thread
# ranks use spread 8%), then an MLP on digits x 1-2 ranks x allreduce/ring x 0.25/25 MiB buckets (mlp-s24) and the
# held-out grid (ho-s24: lenet5 and resnet20 x 1-2 ranks x batch 32/64), 3 interleaved repeats each.
OVERLAP = Path(__file__).parent / "data" / "overlap-2026-11-29"
APART = ("ddp_copies", "overlap_cpu", "skew_floor")


def _summaries(study: str, without=()):
    return _validated(OVERLAP, (study,), without)


def test_the_exposed_all_reduce_priced_apart_brings_short_and_held_out_steps_closer_as_recorded():
    """With DDP's copies, the CPU of hidden buckets and the residual's floor, against the same model without the
    three: the MLP's step time 10.2% median (15.0% without), its ratios 13.8% / 44.4% (17.6% / 52.1%); the held-out
    grid's p90s 10.6% and 16.4% (14.6% and 18.1%), its medians within a point either way (6.2% against 5.5%, 4.5%
    against 4.5%)."""
    # judged on the model they joined: the ring's exchange at its own idle latency (`shared_latency` off), which
    # prices part of what they do (with it, the MLP's step median is 11.8% with the three and without them)
    base = ("shared_latency",)
    with_them, without = _summaries("mlp-s24", base), _summaries("mlp-s24", APART + base)
    assert without["summary"]["median_abs_error"] > with_them["summary"]["median_abs_error"] + 0.03
    assert without["ratio_summary"]["median_abs_error"] > with_them["ratio_summary"]["median_abs_error"] + 0.02
    held, held_without = _summaries("ho-s24"), _summaries("ho-s24", APART)
    assert held_without["summary"]["p90_abs_error"] > held["summary"]["p90_abs_error"] + 0.02
    assert held_without["ratio_summary"]["p90_abs_error"] > held["ratio_summary"]["p90_abs_error"] + 0.01
    assert held["summary"]["median_abs_error"] <= 0.07 and held["ratio_summary"]["median_abs_error"] <= 0.05


def test_small_buckets_hidden_on_full_cores_are_priced_slower_as_measured():
    """The ring with 0.25 MiB buckets on two full cores measured 1.21x slower than with 25 MiB: hiding the small
    bucket took its CPU from backward. With that CPU priced the larger buckets are predicted faster (1.06x); without
    it, the smaller ones (0.99x), the ratio's sign wrong."""
    def ring_ratio(without=()):
        v = _summaries("mlp-s24", without)
        return next(r for r in v["ratios"] if r["axis"] == "bucket_cap_mb" and r["from"].startswith("nproc2-")
                    and "ring" in r["from"])

    with_it, without = ring_ratio(("shared_latency",)), ring_ratio(("overlap_cpu", "shared_latency"))
    assert with_it["measured"] > 1.15
    assert with_it["predicted"] > 1.02 and without["predicted"] < 1.0
    assert ring_ratio()["predicted"] > 1.02  # with the ring at the all-reduce's latency too (1.056)


def test_the_residuals_line_is_not_extrapolated_past_the_compute_it_was_fitted_over():
    """ResNet-20's 2-rank steps (125-245 ms of compute) lie past refnet's (27-108 ms): the line extrapolated priced
    their exposed all-reduce at 8.3 and 13.6 ms where it measured 6.0 and 6.2 (ho-s24). Held at its end, the
    held-out ratios' p90 is lower in each of three recorded grids of three calibrations (16.4% against 16.8%,
    16.5% against 17.6%, 11.6% against 12.3%)."""
    cases = ((OVERLAP, ("ho-s24",)), (LATER, ("ho-study6",)), (DATA, ("ho-study2",)))
    for data, studies in cases:
        held, extrapolated = (_validated(data, studies, w)["ratio_summary"] for w in ((), ("comm_range",)))
        assert held["p90_abs_error"] < extrapolated["p90_abs_error"], data.name


# A step's constant on two ranks and DDP's buffer broadcast (2026-11-29, twenty-fifth session): a calibration that
# also ran refnet alone and on two ranks at batch 2 (runs/cal-s25; the machine's speed moved 35% while it was made,
# so its absolute times are off by about that and the model axis with them), and the held-out grid measured with 4x
# longer runs (ho-s25: lenet5 and resnet20 x 1-2 ranks x batch 32/64, 8,192 samples, 3 interleaved repeats).
SLOWDOWN = Path(__file__).parent / "data" / "slowdown-2026-11-29"


def test_the_constant_and_the_broadcast_bring_the_held_out_speedups_within_the_target_as_recorded():
    """LeNet-5 (no buffers, a 2-3 ms forward) ran 1.28x slower on two ranks, ResNet-20 (19 batch norms) 1.10x: one
    ratio cannot price both. With the constant per step from refnet's two batches and the broadcast of the buffers
    priced apart, the four 1-to-2-rank speedups were within 5.6% (p90; 3.6% median); without the constant 7.7%,
    without the broadcast 8.5%, without the slowdown at all 12.0%. With the optimizer's and the loop's overheads on
    lines in the step's compute (overhead_slope, 2026-11-29): 2.0% (1.7%); without the constant 3.1%, without the
    broadcast 13.5%, without the slowdown 9.8%."""
    def nproc(without=()):
        return _validated(SLOWDOWN, ("ho-s25",), without)["ratio_summary"]["by_axis"]["nproc"]

    both = nproc()
    assert both["count"] == 4 and both["median_abs_error"] <= 0.02 and both["p90_abs_error"] <= 0.025
    assert nproc(("rank_constant",))["p90_abs_error"] > both["p90_abs_error"] + 0.01
    assert nproc(("buffer_broadcast",))["p90_abs_error"] > both["p90_abs_error"] + 0.02
    assert nproc(("rank_slowdown",))["p90_abs_error"] > both["p90_abs_error"] + 0.05
    assert nproc(("overhead_slope",))["p90_abs_error"] > both["p90_abs_error"] + 0.03  # (5.9%)


def test_the_ranks_own_loading_on_refnets_line_is_closer_to_the_held_out_waits_as_recorded(monkeypatch):
    """The loader's law alone put every held-out point's wait for its batch low (ho-s25: 4-31%, median 16.9%); on the
    line refnet's runs measured at each rank count (cal-s25: one batch alone and two on two ranks) 10.2%, of both
    signs, and the speedups stay within their target (p90 <= 6%)."""
    def waits():
        v = _validated(SLOWDOWN, ("ho-s25",))
        errors = [p["predicted"]["phases_s"]["data_wait"] / p["measured"]["phases_s"]["data_wait"] - 1
                  for p in v["points"]]
        return statistics.median(abs(e) for e in errors), errors, v["ratio_summary"]["by_axis"]["nproc"]

    line, signs, nproc = waits()
    assert line <= 0.11 and min(signs) < 0 < max(signs) and nproc["p90_abs_error"] <= 0.06
    monkeypatch.setattr(Predictor, "_data_line", lambda self, runs: None)
    law, signs, _ = waits()
    assert law > line + 0.05 and max(signs) < 0


# The held-out grid measured again, on a calibration made the same morning (2026-11-29, twenty-sixth session):
# runs/cal-s25b (no warning; its noise probe 5.5%), its shapes' cache as `predict` timed them, and ho-s26 (lenet5,
# resnet20 x 1-2 ranks x batch 32/64, 2,048 samples, 3 interleaved repeats; their spread a median 10.9%).
FRESH = Path(__file__).parent / "data" / "heldout-2026-11-29"


def test_a_held_out_grid_measured_hours_after_its_calibration_meets_the_step_time_targets_as_recorded():
    """The absolute target (median <= max(7%, the repeats' spread), p90 <= 15%) on the held-out models: 4.2% / 10.5%,
    1 over and 7 under (2.6% / 9.3% before each op's own terms, op_overhead, which cost this grid: ResNet-20's one-rank
    steps now 5-8% under). The ratios are 6.1% / 11.6% (10 over, 2 under), short of theirs (5% / 10%): LeNet-5's
    speedups at both batches +8..+11% (its two-rank points' repeats spread up to 29%). With refnet's constant overheads
    (no overhead_slope) the ratios' p90 is 14.8%: LeNet-5's 4-ms one-rank steps took 0.3 ms of optimizer phase too
    much, refnet's at 90 ms of compute."""
    v = _validated(FRESH, ("ho-s26",), shapes=True)
    step, ratios = v["summary"], v["ratio_summary"]
    assert step["count"] == 8 and step["median_abs_error"] <= 0.045 and step["p90_abs_error"] <= 0.11
    assert step["over"] and step["under"] and not step["biased"]
    assert ratios["count"] == 12 and ratios["median_abs_error"] <= 0.065 and ratios["p90_abs_error"] <= 0.12
    assert ratios["over"] and ratios["under"]
    constant = _validated(FRESH, ("ho-s26",), ("overhead_slope",), shapes=True)["ratio_summary"]
    assert constant["p90_abs_error"] > ratios["p90_abs_error"] + 0.02


def test_six_interleaved_rounds_of_the_held_out_grid_meet_both_targets_with_each_ops_own_terms():
    """The same calibration on the grid measured in six interleaved rounds a day later (ho-s28, 2026-11-29; the rounds'
    noise alone would show 2.5% / 7.4%): ratios 2.2% / 4.5% (5 over, 7 under), step time 3.0% / 5.2%. Without each op's
    constant and cold fetch (op_overhead) the ratios were 3.9% / 12.1% (2 over, 10 under), the miss the model ratio
    ResNet-20 over LeNet-5 (-8..-14%): LeNet-5's ops of 0.1-0.3 ms each priced by the factors that fit refnet's
    ops of 1-2 ms, its steps 15-21% under."""
    v = _validated(FRESH, ("ho-s28",), shapes=True)
    step, ratios = v["summary"], v["ratio_summary"]
    assert ratios["count"] == 12 and ratios["median_abs_error"] <= 0.03 and ratios["p90_abs_error"] <= 0.05
    assert ratios["over"] >= 4 and ratios["under"] >= 4
    assert step["count"] == 8 and step["median_abs_error"] <= 0.035 and step["p90_abs_error"] <= 0.06
    off = _validated(FRESH, ("ho-s28",), ("op_overhead",), shapes=True)
    assert off["ratio_summary"]["p90_abs_error"] > 0.10 and off["ratio_summary"]["under"] >= 9
    models = [r["error"] for r in off["ratios"] if r["axis"] == "model"]
    assert len(models) == 4 and max(models) < -0.05
