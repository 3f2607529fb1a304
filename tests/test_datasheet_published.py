"""`predict --hardware` against the published numbers of its development set (perf/published/): each
single-GPU row's throughput within 25%, each 8-GPU row whose source is not held back by its loader within 5
points of its published scaling efficiency, and no prediction above the device's peak."""

from __future__ import annotations

import pytest

from scaletrain.predict.devset import EFFICIENCY_POINTS, TARGET, predict_row, rows

ROWS = rows()
SINGLE = {(r.profile, r.precision, r.batch_per_gpu, r.system): r for r in ROWS if r.gpus == 1}


def _id(r) -> str:
    return f"{r.system.split(' (')[0]}-{r.published_precision}-{r.gpus}gpu"


def test_the_development_set_is_there_with_its_sources():
    assert len(ROWS) >= 12 and {r.profile for r in ROWS} >= {"dgx-a100-80gb", "v100-sxm2-node"}
    assert all("DeepLearningExamples" in r.source and r.images_per_s > 0 for r in ROWS)


@pytest.mark.parametrize("row", [r for r in ROWS if r.gpus == 1], ids=_id)
def test_one_gpu_throughput_is_within_25_percent_of_the_published(row):
    p = predict_row(row)
    error = p["samples_per_s"] / row.images_per_s - 1
    assert abs(error) <= TARGET, f"{_id(row)}: predicted {p['samples_per_s']:.0f}/s, published {row.images_per_s}"
    assert 0 < p["plausibility"]["fraction_of_peak"] <= 1 and p["plausibility"]["flag"] is None


@pytest.mark.parametrize("row", [r for r in ROWS if r.gpus > 1 and r.precision == "fp32"], ids=_id)
def test_eight_gpu_scaling_is_within_5_points_of_the_published(row):
    """fp32/TF32 rows: the published runs' CPU loader keeps up with them (7.7x of 8). The mixed-precision
    rows scale 6.7-7.0x in the source, held back by a PyTorch loader whose rate no profile gives: they are
    reported by benchmarks/fit_datasheet.py, not held here (docs/predict-validation.md)."""
    one = SINGLE[(row.profile, row.precision, row.batch_per_gpu, row.system)]
    published = row.images_per_s / (row.gpus * one.images_per_s)
    predicted = predict_row(row)["samples_per_s"] / (row.gpus * predict_row(one)["samples_per_s"])
    assert abs(predicted - published) <= EFFICIENCY_POINTS, f"{_id(row)}: {predicted:.3f} against {published:.3f}"
