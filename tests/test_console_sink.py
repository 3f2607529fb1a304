"""The loop's console sink (console/sink.py): epoch lines on stdout, progress fed loss, samples and seconds;
a log (not a terminal) gets plain lines at console/pace.py's pace (console/progress.py)."""

from __future__ import annotations

from scaletrain.console.pace import Pace
from scaletrain.console.progress import PlainLines
from scaletrain.console.sink import ConsoleSink

from test_console_pace import Clock


class Bar:
    def __init__(self):
        self.calls = []

    def start_epoch(self, epoch, epochs, steps, done=0):
        self.calls.append(("start", epoch, epochs, steps))

    def step(self, loss, samples, seconds):
        self.calls.append(("step", loss, samples, seconds))

    def end_epoch(self):
        self.calls.append(("end",))

    def close(self):
        self.calls.append(("close",))


def test_epoch_lines_and_the_bar_see_every_step(capsys):
    bar = Bar()
    sink = ConsoleSink(epochs=3, replicas=4, bar=bar)
    sink.epoch_start(0, 3, 2)
    sink.step({"loss": 2.5, "samples": 64, "step_time_s": 0.5})
    sink.step({"loss": 2.0, "samples": 64, "step_time_s": 0.0})
    sink.epoch_end({"epoch": 0, "epoch_time_s": 1.25, "train_loss": 2.25, "top1": 0.5, "top5": 0.9})
    sink.close()
    assert bar.calls == [("start", 0, 3, 2), ("step", 2.5, 256, 0.5), ("step", 2.0, 256, 0.0), ("end",), ("close",)]
    assert capsys.readouterr().out == "epoch 1/3  1.2 s  loss 2.2500  top1 0.5000  top5 0.9000\n"


def test_an_epoch_without_evaluation_prints_no_accuracy(capsys):
    sink = ConsoleSink(epochs=2, replicas=1, progress=False)
    sink.epoch_end({"epoch": 1, "epoch_time_s": 3.0, "train_loss": 0.5})
    assert capsys.readouterr().out == "epoch 2/2  3.0 s  loss 0.5000\n"


def test_output_that_is_not_a_terminal_gets_a_line_from_the_first_step(capsys, monkeypatch):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):  # rich would take either for a terminal
        monkeypatch.delenv(name, raising=False)
    sink = ConsoleSink(epochs=2, replicas=2)  # stdout and stderr captured: a log, as under SLURM or nohup
    sink.epoch_start(0, 2, 400)
    sink.step({"loss": 2.5, "samples": 32, "step_time_s": 0.5})
    sink.close()
    assert capsys.readouterr().out == "epoch 1/2  step 1/400  loss 2.5000  128 samples/s  ETA 0:03:20\n"


def test_plain_lines_at_the_pace_with_the_rate_and_eta_since_the_last_line():
    clock, out = Clock(), []
    bar = PlainLines(write=out.append, pace=Pace(every=100, least_s=10, most_s=30, clock=clock))
    sink = ConsoleSink(epochs=2, replicas=2, bar=bar)
    sink.epoch_start(0, 2, 1000, done=100)  # resumed mid-epoch: 100 steps were trained before
    for i in range(200):
        clock.t += 1 / 16
        sink.step({"loss": 1.0 - i / 1000, "samples": 32, "step_time_s": 0.05 if i < 80 else 0.1})
    assert out == ["epoch 1/2  step 101/1000  loss 1.0000  1,280 samples/s  ETA 0:00:45",
                   # 100 steps on but 10 s after the first line (160 steps): 79 steps of 0.05 s, 81 of 0.1 s
                   "epoch 1/2  step 261/1000  loss 0.8400  850 samples/s  ETA 0:00:56"]
    clock.t += 29
    sink.epoch_end({"epoch": 0, "epoch_time_s": 60.0, "train_loss": 0.9})
    sink.epoch_start(1, 2, 1000)
    clock.t += 29.5  # 58.5 s since the last plain line, but 29.5 s since the epoch's line
    sink.step({"loss": 0.5, "samples": 32, "step_time_s": 0.1})
    assert len(out) == 2
    clock.t += 0.5
    sink.step({"loss": 0.5, "samples": 32, "step_time_s": 0.1})
    assert out[2:] == ["epoch 2/2  step 2/1000  loss 0.5000  640 samples/s  ETA 0:01:40"]
