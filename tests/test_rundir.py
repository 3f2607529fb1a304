"""Tests for the run directory: the checks that protect earlier work, atomic JSON, record trimming."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scaletrain.errors import UserError
from scaletrain.rundir import (RunDir, check_out_dir, default_out, keep_epochs_before, read_jsonl,
                               write_json_atomic)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ------------------------------------------------------------------ check_out_dir

def test_new_and_empty_directories_are_accepted(tmp_path):
    run = check_out_dir(str(tmp_path / "new" / "run"), resume=False)
    assert isinstance(run, RunDir) and run.root == tmp_path / "new" / "run"
    assert not run.root.exists()  # checking writes nothing
    assert check_out_dir(str(tmp_path), resume=False).checkpoint == tmp_path / "checkpoint.pt"


@pytest.mark.parametrize("resume", [False, True])
def test_a_file_is_refused(tmp_path, resume):
    f = tmp_path / "out"
    f.write_text("precious")
    with pytest.raises(UserError, match="is a file"):
        check_out_dir(str(f), resume=resume)
    assert f.read_text() == "precious"


def test_a_started_run_is_refused_without_resume(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"weights")
    (tmp_path / "epochs.jsonl").write_text('{"epoch": 0}\n')
    before = snapshot(tmp_path)
    with pytest.raises(UserError) as e:
        check_out_dir(str(tmp_path), resume=False)
    assert "--resume" in str(e.value) and str(tmp_path) in str(e.value)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("status", ["completed", "stopped"])
def test_a_finished_run_is_refused_without_resume(tmp_path, status):
    (tmp_path / "summary.json").write_text(json.dumps({"status": status, "top1": 0.9}))
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match="already holds a run"):
        check_out_dir(str(tmp_path), resume=False)
    assert snapshot(tmp_path) == before


def test_an_unreadable_summary_is_refused(tmp_path):
    (tmp_path / "summary.json").write_text("{ half a summ")
    with pytest.raises(UserError, match="already holds a run"):
        check_out_dir(str(tmp_path), resume=False)


def test_a_failed_run_without_checkpoint_may_be_restarted(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"status": "failed", "error": "boom"}))
    before = snapshot(tmp_path)
    assert check_out_dir(str(tmp_path), resume=False).root == tmp_path
    assert snapshot(tmp_path) == before


def test_a_failed_run_with_checkpoint_needs_resume(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"status": "failed"}))
    (tmp_path / "checkpoint.pt").write_bytes(b"w")
    with pytest.raises(UserError, match="--resume"):
        check_out_dir(str(tmp_path), resume=False)
    assert check_out_dir(str(tmp_path), resume=True).root == tmp_path


@pytest.mark.parametrize("setup", ["missing", "empty", "summary_only"])
def test_resume_without_checkpoint_is_a_user_error(tmp_path, setup):
    out = tmp_path / "run"
    if setup != "missing":
        out.mkdir()
    if setup == "summary_only":
        (out / "summary.json").write_text(json.dumps({"status": "completed"}))
    with pytest.raises(UserError, match="no checkpoint"):
        check_out_dir(str(out), resume=True)


def test_resume_with_checkpoint_is_accepted_even_when_finished(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"w")
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed"}))
    assert check_out_dir(str(tmp_path), resume=True).root == tmp_path


def test_a_summary_that_is_not_an_object_is_refused(tmp_path):
    (tmp_path / "summary.json").write_text("[]")
    with pytest.raises(UserError, match="already holds a run"):
        check_out_dir(str(tmp_path), resume=False)


# ------------------------------------------------------------------ write_json_atomic

def test_write_json_atomic_writes_and_replaces(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"status": "completed", "top1": 0.5})
    assert json.loads(path.read_text()) == {"status": "completed", "top1": 0.5}
    assert path.read_text().endswith("\n")
    inode = path.stat().st_ino
    write_json_atomic(path, {"status": "failed"})
    assert json.loads(path.read_text()) == {"status": "failed"}
    assert path.stat().st_ino != inode  # replaced by rename, not rewritten in place
    assert os.listdir(tmp_path) == ["summary.json"]


def test_write_json_atomic_failure_keeps_the_old_file(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"status": "completed"})
    before = path.read_bytes()
    with pytest.raises(TypeError):
        write_json_atomic(path, {"status": "x", "bad": object()})
    assert path.read_bytes() == before


def test_write_json_atomic_failure_leaves_no_temp(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"status": "completed"})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})
    assert os.listdir(tmp_path) == ["summary.json"]


# ------------------------------------------------------------------ jsonl records

def write_records(path: Path, epochs: list[int]) -> None:
    path.write_text("".join(json.dumps({"epoch": e, "step": i}) + "\n" for i, e in enumerate(epochs)))


def test_keep_epochs_before_keeps_exactly_the_earlier_epochs(tmp_path):
    path = tmp_path / "metrics-rank0.jsonl"
    write_records(path, [0, 0, 1, 1, 2, 2, 3])
    keep_epochs_before(path, 2)
    assert [(r["epoch"], r["step"]) for r in read_jsonl(path)] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert path.read_text().endswith("}\n")
    assert os.listdir(tmp_path) == ["metrics-rank0.jsonl"]


def test_keep_epochs_before_zero_empties_the_file(tmp_path):
    path = tmp_path / "epochs.jsonl"
    write_records(path, [0, 1])
    keep_epochs_before(path, 0)
    assert path.read_text() == "" and read_jsonl(path) == []


def test_keep_epochs_before_everything_and_blank_lines(tmp_path):
    path = tmp_path / "epochs.jsonl"
    path.write_text('{"epoch": 0}\n\n{"epoch": 1}\n   \n')
    keep_epochs_before(path, 5)
    assert read_jsonl(path) == [{"epoch": 0}, {"epoch": 1}]
    assert path.read_text() == '{"epoch": 0}\n{"epoch": 1}\n'


def test_keep_epochs_before_missing_file_creates_nothing(tmp_path):
    keep_epochs_before(tmp_path / "epochs.jsonl", 3)
    assert os.listdir(tmp_path) == []


def test_keep_epochs_before_drops_a_truncated_last_line(tmp_path):
    path = tmp_path / "metrics-rank0.jsonl"
    write_records(path, [0, 0, 1])
    with open(path, "a") as f:
        f.write('{"epoch": 1, "step": 3, "lo')
    keep_epochs_before(path, 1)
    assert [r["step"] for r in read_jsonl(path)] == [0, 1]


def test_read_jsonl(tmp_path):
    assert read_jsonl(tmp_path / "none.jsonl") == []
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]


# ------------------------------------------------------------------ names

@pytest.mark.parametrize("model, dataset", [
    ("resnet20", "digits"),
    ("mypkg.models:factory", "imagefolder:/data/sets/cats.v2"),
    ("a/b", "imagefolder:C:/x"),
])
def test_default_out_is_one_safe_folder_under_runs(model, dataset):
    out = Path(default_out(model, dataset))
    assert out.parent == Path("runs")
    assert ":" not in out.name and "/" not in out.name
    assert out.name.startswith(model.replace(":", "_").replace("/", "_").replace(".", "_")[:20])


def test_default_out_is_bounded_and_timestamped():
    name = Path(default_out("m" * 100, "imagefolder:" + "d" * 200)).name
    assert name.startswith("m" * 60 + "-")
    stamp = name[61:]
    assert len(stamp) == len("20250101-120000") and stamp[8] == "-" and stamp.replace("-", "").isdigit()


def test_run_dir_paths(tmp_path):
    run = RunDir(tmp_path)
    assert run.config.name == "config.toml" and run.summary.name == "summary.json"
    assert run.epochs.name == "epochs.jsonl" and run.metrics(3).name == "metrics-rank3.jsonl"
    assert {run.config.parent, run.checkpoint.parent, run.metrics(0).parent} == {tmp_path}


def test_the_one_jsonl_writer_writes_whole_lines_in_one_call(tmp_path):
    """rundir.JsonlAppender / append_jsonl: each write is whole lines in one call (O_APPEND), so two writers on
    one file interleave by line, never inside one; read_jsonl reads back what they wrote."""
    from scaletrain.rundir import JsonlAppender, append_jsonl, read_jsonl

    path = tmp_path / "x.jsonl"
    with JsonlAppender(path) as a, JsonlAppender(path) as b:
        a.write({"who": "a", "i": 0})
        b.write({"who": "b", "i": 0}, {"who": "b", "i": 1})
        a.write({"who": "a", "i": 1})
    append_jsonl(path, {"who": "c", "i": 0})
    assert [(r["who"], r["i"]) for r in read_jsonl(path)] == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("c", 0)]
