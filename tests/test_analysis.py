"""analyze_run over a real recorded 2-rank run (tests/data/recorded-lenet5-2rank) and edge cases."""

import json
import shutil
from pathlib import Path

import pytest

from scaletrain.analysis import analyze_run, load_records, steady
from scaletrain.errors import UserError
from scaletrain.profiler import PHASES

RECORDED = Path(__file__).parent / "data" / "recorded-lenet5-2rank"


def test_load_records_reads_every_rank():
    records = load_records(RECORDED)
    assert sorted(records) == [0, 1]
    assert len(records[0]) == len(records[1]) == 22


def test_recorded_phases_add_up_to_step_time_on_every_step():
    for records in load_records(RECORDED).values():
        for r in records:
            assert sum(r["phases_s"].values()) == pytest.approx(r["step_time_s"], rel=0.01)


def test_analyze_run_gives_the_summary_keys():
    result = analyze_run(load_records(RECORDED), {"workers": 0})
    assert set(result["phases_mean_s"]) == set(PHASES)
    assert sum(result["phases_mean_s"].values()) == pytest.approx(result["step_time_mean_s"], rel=0.01)
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert sum(r["slowest_share"] for r in result["ranks"]) == pytest.approx(1.0)
    assert result["stragglers"]["steps_compared"] == 18  # 22 steps less 2 warm-up steps in each of 2 epochs
    assert result["diagnosis"] and result["diagnosis"][0]["kind"] in (
        "input-bound", "communication-bound", "straggler", "compute-bound")
    assert 0 <= result["overlap_ratio"] <= 1
    assert result["bytes_sent_per_step"] == 246824  # lenet5's 61,706 fp32 gradients, 2 (P-1)/P x payload


def test_analysis_matches_what_the_run_wrote():
    written = json.loads((RECORDED / "summary.json").read_text())
    result = analyze_run(load_records(RECORDED), {})
    assert result["phases_mean_s"] == pytest.approx(written["phases_mean_s"])
    assert result["stragglers"]["slowest_counts"] == written["stragglers"]["slowest_counts"]


def test_steady_leaves_out_each_epochs_warm_up():
    records = load_records(RECORDED)[0]
    kept = steady(records)
    assert {r["step_in_epoch"] for r in kept} == set(range(2, 11))


def test_unprofiled_records_give_step_times_but_no_phases():
    records = {0: [{"step": i, "step_in_epoch": i, "step_time_s": 0.1, "samples": 8} for i in range(10)]}
    result = analyze_run(records, {})
    assert result["phases_mean_s"] is None and result["diagnosis"] == []
    assert result["step_time_mean_s"] == pytest.approx(0.1)


def test_damaged_line_is_one_clear_error(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RECORDED, run)
    with open(run / "metrics-rank1.jsonl", "a") as f:
        f.write('{"step": 99, "phas')
    with pytest.raises(UserError, match="metrics-rank1.jsonl line 23 is not valid JSON"):
        load_records(run)


def test_a_rank_file_out_of_reach_is_left_out(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RECORDED, run)
    (run / "metrics-rank1.jsonl").unlink()
    assert sorted(load_records(run, world_size=2)) == [0]


def _epoch_records(first_wait, epochs=3, steps=12):
    return [{"step": e * steps + i, "epoch": e, "step_in_epoch": i, "step_time_s": 0.1 + (first_wait if i == 0 else 0),
             "phases_s": {"data_wait": 0.01 + (first_wait if i == 0 else 0), "h2d": 0, "forward": 0.04,
                          "backward": 0.05, "comm_exposed": 0, "optimizer": 0, "other": 0},
             "comm_total_s": 0, "comm_hidden_s": 0, "overlap_ratio": None, "bytes_sent": 0}
            for e in range(epochs) for i in range(steps)]


def test_slow_epoch_start_is_measured_and_diagnosed():
    result = analyze_run({0: _epoch_records(first_wait=0.6)}, {"workers": 2})
    assert result["epoch_start"]["wait_mean_s"] == pytest.approx(0.6)
    finding = result["diagnosis"][0]
    assert finding["kind"] == "input-bound" and finding["epoch_start"]
    assert "waits 0.60 s" in finding["message"] and "33% of an epoch" in finding["message"]  # 0.6 / (12 x 0.1 + 0.6)
    assert "--persistent-workers" in finding["lever"]


def test_quick_epoch_start_is_not_a_finding():
    result = analyze_run({0: _epoch_records(first_wait=0.02)}, {"workers": 2})
    assert [f["kind"] for f in result["diagnosis"]] == ["compute-bound"]
