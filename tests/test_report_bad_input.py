"""`scaletrain report` and `compare` on damaged files and unusable output paths: one line, exit 2, nothing lost."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from scaletrain.cli import main

DATA = Path(__file__).parent / "data"


def copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(DATA / name, tmp_path / name))


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error: ") and "Traceback" not in captured.err
    return lines[0]


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    path.write_text(json.dumps(change(data)))


def set_key(key: str, value):
    def change(data: dict) -> dict:
        data[key] = value
        return data
    return change


def edit_line(path: Path, index: int, **changes) -> None:
    lines = path.read_text().splitlines()
    lines[index] = json.dumps({**json.loads(lines[index]), **changes})
    path.write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------ a run's files with wrong types

@pytest.mark.parametrize("change, needles", [
    (set_key("world_size", "two"), ['"world_size" is "two" (a string), expected an integer']),
    (set_key("global_batch", [64]), ['"global_batch" is [64] (a list), expected an integer']),
    (set_key("epoch_times_s", {"0": 1.0}), ['"epoch_times_s"', "expected a list of numbers"]),
    (set_key("top1", "high"), ['"top1" is "high" (a string), expected a number (or null)']),
    (set_key("threads_per_rank", 1.5), ['"threads_per_rank" is 1.5 (a number), expected an integer (or null)']),
    (lambda s: {**s, "ranks": [{"rank": 0, "peak_memory_bytes": "lots"}]},
     ['"ranks[0].peak_memory_bytes" is "lots"', "expected a number"]),
    (lambda s: {**s, "diagnosis": [{"kind": "x"}]}, ['"diagnosis[0].message" is missing, expected a string']),
    (lambda s: [s], ["summary.json holds a list where an object is expected"]),
    (lambda s: None, ["summary.json holds null where an object is expected"]),
    (lambda s: 3, ["summary.json holds an integer where an object is expected"]),
])
def test_summary_of_the_wrong_types_is_one_line(tmp_path, capsys, change, needles):
    run_dir = copy("run-a", tmp_path)
    edit_json(run_dir / "summary.json", change)
    assert main(["report", str(run_dir)]) == 2
    line = one_error_line(capsys)
    assert f"{run_dir / 'summary.json'}" in line, line
    for needle in needles:
        assert needle in line, line
    assert line.endswith("fix that value, or delete summary.json to report from the metrics files alone")
    assert not (run_dir / "report.html").exists() and not (run_dir / "plots").exists()


@pytest.mark.parametrize("file, index, changes, needle", [
    ("metrics-rank1.jsonl", 2, {"step_time_s": "slow"},
     'line 3: "step_time_s" is "slow" (a string), expected a number'),
    ("metrics-rank0.jsonl", 0, {"loss": [2.3]}, 'line 1: "loss" is [2.3] (a list), expected a number (or null)'),
    ("metrics-rank0.jsonl", 4, {"phases_s": {"forward": "fast"}},
     'line 5: "phases_s.forward" is "fast" (a string), expected a number'),
    ("epochs.jsonl", 1, {"top1": "91%"}, 'line 2: "top1" is "91%" (a string), expected a number (or null)'),
    ("epochs.jsonl", 0, {"epoch": 0.5}, 'line 1: "epoch" is 0.5 (a number), expected an integer'),
])
def test_jsonl_lines_of_the_wrong_types_are_one_line(tmp_path, capsys, file, index, changes, needle):
    run_dir = copy("run-a", tmp_path)
    edit_line(run_dir / file, index, **changes)
    assert main(["report", str(run_dir)]) == 2
    line = one_error_line(capsys)
    assert f"{run_dir / file} {needle}: fix or delete that line" in line, line


def test_a_metrics_line_that_is_not_an_object_or_lacks_its_step(tmp_path, capsys):
    run_dir = copy("run-a", tmp_path)
    path = run_dir / "metrics-rank0.jsonl"
    path.write_text("[1, 2]\n" + path.read_text())
    assert main(["report", str(run_dir)]) == 2
    assert f"{path} line 1 holds a list where an object is expected" in one_error_line(capsys)
    path.write_text('{"epoch": 0, "step_time_s": 0.1}\n')
    assert main(["report", str(run_dir)]) == 2
    assert f'{path} line 1: "step" is missing, expected an integer' in one_error_line(capsys)


def test_config_toml_of_the_wrong_types_is_one_line(tmp_path, capsys):
    run_dir = copy("run-a", tmp_path)
    (run_dir / "config.toml").write_text('model = "resnet20"\nnproc = "two"\n')
    assert main(["report", str(run_dir)]) == 2
    assert f'{run_dir / "config.toml"}: "nproc" is "two" (a string), expected an integer' in one_error_line(capsys)


@pytest.mark.parametrize("change, needle", [
    (lambda pts: [{**pts[0], "epoch_time_s": "fast"}, *pts[1:]],
     'point 1 (nproc1-workers0): "epoch_time_s" is "fast" (a string), expected a number (or null)'),
    (lambda pts: [pts[0], {**pts[1], "axes": "nproc=1"}, *pts[2:]],
     'point 2 (nproc1-workers2): "axes" is "nproc=1" (a string), expected an object of numbers, strings or '
     'true/false'),
    (lambda pts: [*pts[:2], {**pts[2], "efficiency": [0.9]}, *pts[3:]],
     'point 3 (nproc2-workers0): "efficiency" is [0.9] (a list), expected a number (or null)'),
    (lambda pts: [*pts[:3], {**pts[3], "config": {"nproc": "2"}}, *pts[4:]],
     'point 4 (nproc2-workers2): "config.nproc" is "2" (a string), expected an integer (or null)'),
    (lambda pts: [*pts[:1], {**pts[1], "diagnosis": ["input-bound"]}],
     'point 2 (nproc1-workers2): "diagnosis[0]" is "input-bound" (a string), expected an object'),
])
def test_study_json_of_the_wrong_types_is_one_line(tmp_path, capsys, change, needle):
    study_dir = copy("study-a", tmp_path)
    edit_json(study_dir / "study.json", change)
    assert main(["report", str(study_dir)]) == 2
    line = one_error_line(capsys)
    assert f"{study_dir / 'study.json'} {needle}: fix that value, or rerun the study" in line, line
    assert not (study_dir / "report.html").exists()


def test_study_toml_of_the_wrong_types_is_one_line_and_a_bare_axis_value_is_fine(tmp_path, capsys):
    study_dir = copy("study-a", tmp_path)
    (study_dir / "study.toml").write_text('repeats = "once"\n[axes]\nnproc = [1, 2, 4]\n')
    assert main(["report", str(study_dir)]) == 2
    assert '"repeats" is "once" (a string), expected an integer' in one_error_line(capsys)
    (study_dir / "study.toml").write_text("[axes]\nnproc = [1, 2, 4]\nworkers = 0\n")  # one bare value
    assert main(["report", str(study_dir)]) == 0


# ------------------------------------------------------------------ where the output goes

def test_compare_html_that_is_a_directory_or_under_a_file(tmp_path, capsys):
    a, b = str(DATA / "run-a"), str(DATA / "run-b")
    folder = tmp_path / "page.html"
    folder.mkdir()
    assert main(["compare", a, b, "--html", str(folder)]) == 2
    assert one_error_line(capsys) == (f"error: --html {folder} is a directory: give a file path such as "
                                      f"{folder / 'compare.html'}")
    assert list(folder.iterdir()) == []
    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me")
    assert main(["compare", a, b, "--html", str(blocker / "c.html")]) == 2
    assert one_error_line(capsys) == (f"error: --html {blocker / 'c.html'}: {blocker} is a file, not a folder; "
                                      "write the page elsewhere")
    assert main(["compare", a, b, "--html", str(blocker / "deeper" / "c.html")]) == 2
    assert f"{blocker} is a file, not a folder" in one_error_line(capsys)
    assert blocker.read_text() == "keep me"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs a /proc file system")
def test_compare_html_where_no_file_can_be_created(capsys):
    # root passes every permission check, yet cannot create a file in /proc
    assert main(["compare", str(DATA / "run-a"), str(DATA / "run-b"), "--html", "/proc/x.html"]) == 2
    assert one_error_line(capsys).startswith("error: --html /proc/x.html: cannot create a file in /proc (")
    assert not os.path.exists("/proc/x.html")


def test_report_whose_output_places_are_taken(tmp_path, capsys):
    run_dir = copy("run-a", tmp_path)
    (run_dir / "report.html").mkdir()
    assert main(["report", str(run_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before any table is printed
    assert captured.err == (f"error: cannot write {run_dir / 'report.html'}: it is a directory; move it away, or "
                            "copy the directory somewhere you can write and report the copy\n")
    (run_dir / "report.html").rmdir()
    (run_dir / "plots").write_text("not a folder")
    assert main(["report", str(run_dir)]) == 2
    assert f"cannot write {run_dir / 'plots'}/: it is a file" in one_error_line(capsys)
    assert (run_dir / "plots").read_text() == "not a folder" and not (run_dir / "report.html").exists()
    study_dir = copy("study-a", tmp_path)
    (study_dir / "plots").write_text("x")
    assert main(["report", str(study_dir)]) == 2
    assert f"cannot write {study_dir / 'plots'}/: it is a file" in one_error_line(capsys)
