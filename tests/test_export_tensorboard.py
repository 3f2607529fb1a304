"""TensorBoard scalars as written to the event file: per-step and per-epoch values, learning rate included."""

import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from scaletrain.export.tensorboard import ScalarSink  # noqa: E402


def _scalars(run_dir):
    events = EventAccumulator(str(run_dir / "tensorboard" / "rank0"))
    events.Reload()
    return {tag: [(e.step, pytest.approx(e.value)) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_step_and_epoch_learning_rates_are_scalars(tmp_path):
    sink = ScalarSink(tmp_path, rank=0)
    for step, lr in enumerate((0.1, 0.05)):
        sink({"step": step, "loss": 2.0 - step, "lr": lr, "step_time_s": 0.1, "samples_per_s": 320.0,
              "phases_s": {"forward": 0.04}})
    sink({"step": 2, "loss": None, "lr": None, "step_time_s": 0.1})  # no lr recorded: nothing written
    sink.epoch_end({"epoch": 0, "epoch_time_s": 1.5, "train_loss": 1.5, "lr": 0.025, "top1": None})
    sink.close()
    scalars = _scalars(tmp_path)
    assert scalars["train/lr"] == [(0, 0.1), (1, 0.05)]
    assert scalars["epoch/lr"] == [(0, 0.025)]
    assert scalars["train/loss"] == [(0, 2.0), (1, 1.0)]
    assert scalars["phases_s/forward"] == [(0, 0.04), (1, 0.04)]
    assert "epoch/top1" not in scalars  # a missing value is left out, not written as 0


def _record(step, loss, lr, step_time, samples_per_s, forward, epoch_steps=100):
    return {"step": step, "epoch": 0, "step_in_epoch": step, "epoch_steps": epoch_steps, "loss": loss, "lr": lr,
            "step_time_s": step_time, "samples_per_s": samples_per_s, "phases_s": {"forward": forward}}


def test_one_point_per_window_holds_its_means(tmp_path):
    sink = ScalarSink(tmp_path, rank=0, every=3)
    # 7 steps: windows 0-2 and 3-5 written when full, step 6 alone at close
    times = [0.1, 0.2, 0.3, 0.1, 0.1, 0.4, 0.2]
    for step, t in enumerate(times):
        sink(_record(step, loss=float(step), lr=0.1 - 0.01 * step, step_time=t, samples_per_s=64 / t,
                     forward=t / 2))
    sink.close()
    scalars = _scalars(tmp_path)
    assert [s for s, _ in scalars["train/loss"]] == [2, 5, 6]  # each point at its window's last step
    assert [v for _, v in scalars["train/loss"]] == [1.0, 4.0, 6.0]  # the window's mean
    assert [v for _, v in scalars["train/lr"]] == [pytest.approx(0.08), pytest.approx(0.05), pytest.approx(0.04)]
    assert [v for _, v in scalars["step/time_s"]] == [pytest.approx(0.2), pytest.approx(0.2), pytest.approx(0.2)]
    # the throughput is the window's samples over its time (64 a step): 192 / 0.6 s, not the mean of the rates
    assert scalars["step/samples_per_s"][0] == (2, pytest.approx(320.0))
    assert scalars["phases_s/forward"][1] == (5, pytest.approx(0.1))


def test_an_epochs_last_step_closes_its_window(tmp_path):
    sink = ScalarSink(tmp_path, rank=1, every=10)  # rank 1: no epoch_end call reaches it
    for step in range(4):
        r = _record(step, loss=1.0, lr=0.1, step_time=0.1, samples_per_s=640.0, forward=0.05, epoch_steps=4)
        sink(r)
    assert sink.window == []  # flushed at the epoch's last step, not held over into the next epoch
    sink.close()
    events = EventAccumulator(str(tmp_path / "tensorboard" / "rank1"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [3]


def test_the_window_is_a_setting_with_a_clear_error():
    from scaletrain.config.sections import ProfileConfig
    from scaletrain.errors import UserError

    assert ProfileConfig().tensorboard_every == 10
    with pytest.raises(UserError, match="--tensorboard-every"):
        ProfileConfig(tensorboard_every=0)
