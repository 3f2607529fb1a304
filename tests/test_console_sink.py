"""The loop's console sink (console/sink.py): epoch lines on stdout, the bar fed loss and samples/s."""

from __future__ import annotations

from scaletrain.console.sink import ConsoleSink


class Bar:
    def __init__(self):
        self.calls = []

    def start_epoch(self, epoch, epochs, steps, done=0):
        self.calls.append(("start", epoch, epochs, steps))

    def step(self, loss, samples_per_s):
        self.calls.append(("step", loss, samples_per_s))

    def end_epoch(self):
        self.calls.append(("end",))

    def close(self):
        self.calls.append(("close",))


def test_epoch_lines_and_the_bar_see_every_step(capsys):
    sink = ConsoleSink(epochs=3, world_size=4, bar=False)
    sink.bar = bar = Bar()
    sink.epoch_start(0, 3, 2)
    sink.step({"loss": 2.5, "samples": 64, "step_time_s": 0.5})
    sink.step({"loss": 2.0, "samples": 64, "step_time_s": 0.0})  # no time measured: no rate, no error
    sink.epoch_end({"epoch": 0, "epoch_time_s": 1.25, "train_loss": 2.25, "top1": 0.5, "top5": 0.9})
    sink.close()
    assert bar.calls == [("start", 0, 3, 2), ("step", 2.5, 64 * 4 / 0.5), ("step", 2.0, None), ("end",), ("close",)]
    assert capsys.readouterr().out == "epoch 1/3  1.2 s  loss 2.2500  top1 0.5000  top5 0.9000\n"


def test_an_epoch_without_evaluation_prints_no_accuracy(capsys):
    sink = ConsoleSink(epochs=2, world_size=1, bar=False)
    sink.epoch_end({"epoch": 1, "epoch_time_s": 3.0, "train_loss": 0.5})
    assert capsys.readouterr().out == "epoch 2/2  3.0 s  loss 0.5000\n"
