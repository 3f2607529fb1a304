"""The end-of-run summary as printed (console/summary.py): every number as measured, none rounded to 0."""

from rich.console import Console

from scaletrain.console.summary import summary_table
from scaletrain.grid import rich_table

SUMMARY = {"model": "resnet50", "dataset": "imagefolder:/data", "status": "completed", "world_size": 2,
           "global_batch": 8, "device": "cpu", "backend": "gloo", "precision": "fp32", "epochs": 1,
           "epochs_planned": 1, "top1": 0.1, "best_top1": 0.1, "top5": 0.5, "epoch_times_s": [60.0],
           "effective_lr": 0.1, "wall_time_s": 70.0}


def _text(summary, replicas=None):
    console = Console(width=200, record=True)
    console.print(rich_table(summary_table(summary, replicas)))
    return " ".join(console.export_text().split())


def test_a_slow_run_shows_its_throughput_not_zero():
    text = _text({**SUMMARY, "samples_per_s": 0.43})  # a short run of large images on CPU
    assert "0.43 samples/s" in text and " 0 samples/s" not in text
    assert "1,234 samples/s" in _text({**SUMMARY, "samples_per_s": 1234.4})


def test_a_run_without_a_steady_step_says_so():
    text = _text({**SUMMARY, "samples_per_s": None})
    assert "too short for a steady state" in text and "samples/s" not in text


def test_the_ranks_that_share_the_batch_come_from_the_layout():
    # a parameter server of 1 server and 2 workers: 3 ranks, 2 of which take the global batch of 64
    text = _text({**SUMMARY, "world_size": 3, "global_batch": 64, "samples_per_s": 10.0}, replicas=2)
    assert "2 x 32 = 64 (of 3 ranks; cpu, gloo, fp32)" in text
    assert "2 x 4 = 8 (cpu, gloo, fp32)" in _text({**SUMMARY, "samples_per_s": 10.0})
