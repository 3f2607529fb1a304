"""`scaletrain report` and `scaletrain compare` from the command line: output, files, exit codes."""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

import pytest
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


@pytest.mark.slow  # two more launches of report and compare: make test-slow; the same in-process below
def test_bad_paths_get_one_line_and_exit_2(tmp_path):
    proc = scaletrain("report", str(tmp_path / "nope"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and "does not exist" in proc.stderr
    proc = scaletrain("compare", str(DATA / "run-a"), str(DATA / "study-a"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: cannot compare a run") and proc.stderr.count("\n") == 1


def test_bad_paths_get_one_line_and_exit_2_in_process(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and captured.err.count("\n") == 1
    assert "does not exist" in captured.err
    assert main(["compare", str(DATA / "run-a"), str(DATA / "study-a")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot compare a run") and err.count("\n") == 1


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


def test_compare_shows_the_configuration_differences_before_the_phases(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich: one table row per line
    b = copy("run-b", tmp_path)
    config = (b / "config.toml").read_text()
    (b / "config.toml").write_text(config.replace("nproc = 2", "nproc = 1").replace('precision = "fp32"',
                                                                                  'precision = "bf16"'))
    html = tmp_path / "cmp.html"
    assert main(["compare", str(DATA / "run-a"), str(b), "--html", str(html)]) == 0
    lines = capsys.readouterr().out.splitlines()

    def row(first: str) -> int:
        cells = [line.split("│") for line in lines]
        return next(i for i, c in enumerate(cells) if len(c) > 1 and c[1].strip() == first)

    title = next(i for i, line in enumerate(lines) if "configuration: the settings that differ" in line)
    assert [c.strip() for c in lines[row("nproc")].split("│")[1:4]] == ["nproc", "2", "1"]
    assert [c.strip() for c in lines[row("precision")].split("│")[1:4]] == ["precision", "fp32", "bf16"]
    assert title < row("nproc") < row("precision") < row("backward")
    text = html.read_text()
    assert text.index("configuration: the settings that differ") < text.index('<td class="text">backward</td>')
    assert '<td class="text">nproc</td><td class="text">2</td><td class="text">1</td>' in text
    assert '<td class="text">precision</td><td class="text">fp32</td><td class="text">bf16</td>' in text


def test_compare_says_when_nothing_was_configured_differently(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["compare", str(DATA / "study-a"), str(DATA / "study-b")]) == 0
    out = capsys.readouterr().out
    assert out.index("none: A and B ran with the same configuration") < out.index("studies side by side")


def test_report_of_a_study_flags_efficiency_above_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    study_dir = copy("study-a", tmp_path)
    points = json.loads((study_dir / "study.json").read_text())
    for p in points:  # as the trainer records them from now on
        p["threads_per_rank"], p["cpu_cores"] = (2 if p["axes"]["nproc"] == 1 else 1), 2
    points[2].update(epoch_time_s=40.0 / 11.02, speedup=11.02, efficiency=5.51)
    (study_dir / "study.json").write_text(json.dumps(points))
    assert main(["report", str(study_dir)]) == 0
    out = capsys.readouterr().out
    warning = ("efficiency 5.51 above 1.0 at nproc=2, workers=0 (speedup 11.02x, ideal 2.00x): not a real speedup — "
               "the baseline (nproc=1, workers=0) ran 2 threads/rank vs 1 here, or the machine was busy while the "
               "baseline ran; rerun with --threads 1 for every point")
    assert f"\nwarning: {warning}\n" in out
    assert "threads/rank" in out
    page = html.unescape((study_dir / "report.html").read_text()).replace("\xa0", " ")
    assert warning in page and "<th>threads/rank</th>" in page and "above ideal: see below" in page
