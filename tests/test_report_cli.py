"""`scaletrain report` and `scaletrain compare` from the command line: output, files, exit codes."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import assert_ok, scaletrain

from scaletrain.cli import main

DATA = Path(__file__).parent / "data"


def copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(DATA / name, tmp_path / name))


def test_report_a_run(tmp_path):
    run_dir = copy("run-a", tmp_path)
    proc = scaletrain("report", str(run_dir))
    assert_ok(proc)
    assert "41.2 ms" in proc.stdout and "compute-bound" in proc.stdout
    assert proc.stdout.strip().endswith(f"report: {run_dir / 'report.html'}")
    assert (run_dir / "report.html").is_file()


def test_bad_paths_get_one_line_and_exit_2(tmp_path):
    proc = scaletrain("report", str(tmp_path / "nope"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and "does not exist" in proc.stderr
    proc = scaletrain("compare", str(DATA / "run-a"), str(DATA / "study-a"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: cannot compare a run") and proc.stderr.count("\n") == 1


def test_other_bad_input_in_process(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "neither a run nor a study" in capsys.readouterr().err
    run_dir = copy("run-a", tmp_path)
    for f in run_dir.glob("metrics-rank*.jsonl"):
        f.write_text("")
    assert main(["report", str(run_dir)]) == 2
    assert "no metrics lines" in capsys.readouterr().err
    assert not (run_dir / "report.html").exists()
    assert main(["compare", str(DATA / "run-a"), str(DATA / "run-b"), "--html", str(tmp_path / "no" / "c.html")]) == 2
    assert "its folder does not exist" in capsys.readouterr().err


def test_report_a_study_and_a_run_without_phases(tmp_path, capsys):
    study_dir = copy("study-a", tmp_path)
    assert main(["report", str(study_dir)]) == 0
    out = capsys.readouterr().out
    assert "0:00:22" in out and f"report: {study_dir / 'report.html'}" in out
    assert main(["report", str(copy("run-noprofile", tmp_path))]) == 0
    assert "--profile off" in capsys.readouterr().out


def test_compare_runs_and_studies(tmp_path, capsys):
    assert main(["compare", str(DATA / "run-a"), str(DATA / "run-b")]) == 0
    out = capsys.readouterr().out
    assert "backward: 41.2 ms -> 23.9 ms per step (-42%), the largest change" in out
    html = tmp_path / "cmp.html"
    assert main(["compare", str(DATA / "study-a"), str(DATA / "study-b"), "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "nproc=2, workers=2: epoch time 16.00 s -> 14.00 s" in out and f"comparison: {html}" in out
    text = html.read_text()
    assert text.count('<img src="data:image/png;base64,') == 1 and "14.00 s" in text and "http" not in text
