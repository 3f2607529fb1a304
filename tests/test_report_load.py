"""report.load: which directory is which, reading runs and studies from their files alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from scaletrain.errors import UserError
from scaletrain.report import load

DATA = Path(__file__).parent / "data"


def copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(DATA / name, tmp_path / name))


def test_kind_of_run_and_study():
    assert load.kind_of(DATA / "run-a") == "run"
    assert load.kind_of(DATA / "run-noprofile") == "run"
    assert load.kind_of(DATA / "study-a") == "study"


@pytest.mark.parametrize("make, words", [
    (lambda p: p / "missing", ["does not exist", "--out"]),
    (lambda p: p, ["neither a run nor a study", "study.json", "summary.json", "metrics-rank*.jsonl"]),
    (lambda p: (p / "f.txt").write_text("x") and p / "f.txt", ["is a file"]),
    (lambda p: (p / "study.toml").write_text("[axes]\n") and p, ["study.toml but no study.json"]),
])
def test_kind_of_refuses_what_is_neither(tmp_path, make, words):
    with pytest.raises(UserError) as e:
        load.kind_of(make(tmp_path))
    assert all(w in str(e.value) for w in words), str(e.value)
    assert "\n" not in str(e.value)


def test_load_run_reads_every_file():
    run = load.load_run(DATA / "run-a")
    assert sorted(run.records) == [0, 1] and all(len(r) == 12 for r in run.records.values())
    assert run.profiled and run.config["model"] == "resnet20" and len(run.epochs) == 2
    assert run.analysis["phases_mean_s"]["backward"] == pytest.approx(0.0412)
    assert run.analysis["phases_mean_s"]["data_wait"] == pytest.approx(0.0025)  # each epoch's first step left out
    assert run.notes == []


def test_analysis_is_recomputed_when_the_analysis_module_exists(tmp_path):
    run_dir = copy("run-a", tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["phases_mean_s"]["backward"] = 99.0  # a stale summary must not win over the metrics files
    (run_dir / "summary.json").write_text(json.dumps(summary))
    run = load.load_run(run_dir)
    assert run.analysis_source == "recomputed from the metrics files"
    assert run.analysis["phases_mean_s"]["backward"] == pytest.approx(0.0412)
    assert run.analysis["peak_memory_bytes"] == 412_000_000  # memory comes from summary.json


def test_without_the_analysis_module_summary_fields_are_used(monkeypatch):
    monkeypatch.setattr(load, "analyzer", lambda: None)
    run = load.load_run(DATA / "run-a")
    assert run.analysis_source == "summary.json"
    assert run.analysis["diagnosis"][0]["kind"] == "compute-bound"
    assert run.analysis["stragglers"]["slowest_counts"] == {"0": 0, "1": 10}


def test_run_without_summary_still_loads(tmp_path, monkeypatch):
    run_dir = copy("run-a", tmp_path)
    (run_dir / "summary.json").unlink()
    run = load.load_run(run_dir)
    assert run.summary is None and "no summary.json" in run.notes[0]
    assert run.analysis["phases_mean_s"]["forward"] == pytest.approx(0.0165)
    monkeypatch.setattr(load, "analyzer", lambda: None)
    assert load.load_run(run_dir).analysis == {}


def test_run_with_no_metrics_lines_is_an_error(tmp_path):
    run_dir = copy("run-a", tmp_path)
    for f in run_dir.glob("metrics-rank*.jsonl"):
        f.write_text("")
    (run_dir / "summary.json").write_text(json.dumps({"status": "failed", "error": "port 29500 is busy"}))
    with pytest.raises(UserError, match="no metrics lines.*port 29500 is busy"):
        load.load_run(run_dir)


def test_cut_off_last_line_is_left_out_with_a_note(tmp_path):
    run_dir = copy("run-a", tmp_path)
    f = run_dir / "metrics-rank1.jsonl"
    f.write_text(f.read_text() + '{"step": 12, "epo')
    run = load.load_run(run_dir)
    assert len(run.records[1]) == 12 and "cut off" in run.notes[0]
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:3] + ["{oops"] + lines[3:]) + "\n")
    with pytest.raises(UserError, match="line 4 is not valid JSON"):
        load.load_run(run_dir)


def test_overview_from_summary_and_from_files_alone(tmp_path, monkeypatch):
    ov = load.overview(load.load_run(DATA / "run-a"))
    assert (ov["world_size"], ov["batch_per_rank"], ov["global_batch"]) == (2, 32, 64)
    assert ov["top1"] == 0.91 and ov["status"] == "completed" and ov["step_time_mean_s"] == pytest.approx(0.073)
    assert ov["samples_per_s"] == pytest.approx(64 / 0.073)
    run_dir = copy("run-a", tmp_path)
    (run_dir / "summary.json").unlink()
    monkeypatch.setattr(load, "analyzer", lambda: None)
    bare = load.overview(load.load_run(run_dir))
    for key in ("world_size", "batch_per_rank", "model", "precision"):
        assert bare[key] == ov[key]
    for key in ("top1", "epoch_time_median_s", "samples_per_s"):
        assert bare[key] == pytest.approx(ov[key])
    assert bare["step_time_mean_s"] == pytest.approx(0.073) and bare["status"] == "unfinished"


def test_load_study():
    study = load.load_study(DATA / "study-a")
    assert study.axes == ["nproc", "workers"] and len(study.points) == 6
    assert load.axis_values(study, "nproc") == [1, 2, 4]
    assert load.load(DATA / "study-a").points[5]["status"] == "failed"


def test_damaged_study_json(tmp_path):
    (tmp_path / "study.json").write_text('{"id": "x"}')
    with pytest.raises(UserError, match="not a list of points"):
        load.load_study(tmp_path)
    (tmp_path / "study.json").write_text("[{")
    with pytest.raises(UserError, match="not valid JSON"):
        load.load_study(tmp_path)


def test_a_run_is_not_a_study_and_back():
    with pytest.raises(UserError, match="is a run, not a study"):
        load.load_study(DATA / "run-a")
    with pytest.raises(UserError, match="is a study, not a run"):
        load.load_run(DATA / "study-a")


def test_overview_takes_the_ranks_that_share_the_batch_from_the_runs_layout(tmp_path, monkeypatch):
    """A parameter-server run of 3 ranks, one a server: 2 workers share the global batch of 64 (32 each);
    dividing by the world's 3 ranks gave 21 a rank, and the files alone counted 3 ranks' samples."""
    run_dir = copy("run-a", tmp_path)
    config = run_dir / "config.toml"
    config.write_text(config.read_text().replace("nproc = 2", 'nproc = 3\nstrategy = "ps-sync"'))
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "world_size": 3}))
    ov = load.overview(load.load_run(run_dir))
    assert (ov["world_size"], ov["batch_per_rank"], ov["global_batch"]) == (3, 32, 64)
    (run_dir / "summary.json").unlink()
    monkeypatch.setattr(load, "analyzer", lambda: None)
    bare = load.overview(load.load_run(run_dir))
    assert (bare["world_size"], bare["batch_per_rank"], bare["global_batch"]) == (3, 32, 64)
    assert bare["samples_per_s"] == pytest.approx(ov["samples_per_s"])  # 2 workers' samples, as summary.json's
    from scaletrain.report.tables import run_summary

    assert dict(run_summary(ov, "summary.json").rows)["ranks x batch"] == "2 x 32 = 64 (of 3 ranks)"
