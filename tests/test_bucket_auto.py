"""`--bucket-cap-mb auto`: rank 0 times this launch's all-reduce, the model picks the cap, every rank uses it."""

from __future__ import annotations

import json

import pytest

import multirank
from scaletrain.perf.buckets import assign_buckets
from scaletrain.predict import calibration
from scaletrain.predict.model import BUCKET_CAPS_MB

from predict_fixtures import fake_calibration


def test_auto_picks_a_candidate_and_ddp_buckets_by_it(ranks, tmp_path):
    calibration.save(fake_calibration(threads=(1, 2)), calibration.cache_path())
    out = tmp_path / "run"
    s = multirank.train(ranks, "--nproc", "2", "--bucket-cap-mb", "auto", "--model", "lenet5", "--dataset",
                        "synthetic", "--synthetic-samples", "256", "--image-size", "32", "--batch-size", "16",
                        "--epochs", "1", "--out", str(out))
    auto = s["bucket_cap_auto"]
    assert auto["chosen_mb"] in BUCKET_CAPS_MB and auto["alpha_s"] >= 0 and auto["beta_s_per_byte"] >= 0
    assert "bucket_cap_mb = \"auto\"" in (out / "config.toml").read_text()
    # lenet5's gradients in the order backward produces them (the reverse of registration)
    from scaletrain.models.registry import build_model

    model = build_model("lenet5", num_classes=10, in_channels=3, image_size=32)
    sizes = [4 * p.numel() for p in model.parameters()][::-1]
    want = len(assign_buckets(sizes, auto["chosen_mb"]))
    steps = [json.loads(line) for line in (out / "metrics-rank0.jsonl").read_text().splitlines()]
    assert {len(r["comm_intervals_s"]) for r in steps[2:]} == {want}


def test_a_word_other_than_auto_is_refused():
    from scaletrain.errors import UserError

    with pytest.raises(UserError, match="auto"):
        multirank.train_config("--bucket-cap-mb", "big")
