"""The cost seam: every strategy prices its own step (Strategy.cost, found through comm/registry.py), and
predict/ names none. A strategy added in one module (tests/strategy_plugin.py) and one registry line is
priced by `predict` without touching predict/."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from predict_fixtures import fake_calibration
from scaletrain.cli import main
from scaletrain.comm import registry
from scaletrain.perf import alphabeta
from scaletrain.predict import calibration

PREDICT = Path(__file__).resolve().parent.parent / "src" / "scaletrain" / "predict"


def test_predict_branches_on_no_strategy_name():
    pattern = re.compile(r"strategy\s*(==|!=|\bin\b)|startswith\(\"ps|splits_model")
    offenders = [f"{p.name}:{i}" for p in PREDICT.glob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1)
                 if pattern.search(line)]
    assert offenders == []


def test_a_strategy_added_in_one_module_and_one_registry_line_is_priced(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.STRATEGIES, "flat", "strategy_plugin:FlatAfterBackward")
    monkeypatch.setitem(registry.OPTIONS, "flat", ())
    cal = calibration.save(fake_calibration(), tmp_path / "cal.json")
    out = tmp_path / "p"
    assert main(["predict", "--calibration", str(cal), "--model", "lenet5", "--nproc", "2", "--batch-size", "32",
                 "--strategy", "flat,allreduce", "--out", str(out)]) == 0
    flat, ddp = json.loads((out / "prediction.json").read_text())["points"]
    assert flat["config"]["strategy"] == "flat" and ddp["config"]["strategy"] == "allreduce"
    fit = fake_calibration()["network"]["fits"]["allreduce"]
    grads = flat["flat"]["bytes"]
    assert flat["phases_s"]["comm_exposed"] == pytest.approx(
        alphabeta.predict(fit["alpha_s"], fit["beta_s_per_byte"], 2, grads))
    assert ddp["memory_bytes"]["params"] - flat["memory_bytes"]["params"] == grads  # DDP's bucket copy alone
    assert flat["comm"]["overlap_ratio"] == 0.0 and "best_bucket_cap_mb" in ddp["comm"]  # DDP: its buckets
