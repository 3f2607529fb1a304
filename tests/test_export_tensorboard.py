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
