"""report.build: report.html and plots/ written from a directory's files, nothing else touched."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import shutil
from pathlib import Path

import pytest
from PIL import Image

from scaletrain.errors import UserError
from scaletrain.report import build, output, write_run_report, write_study_report
from scaletrain.report.compare import compare_runs
from scaletrain.report.load import load_run, overview

DATA = Path(__file__).parent / "data"
CURVES = {"loss-per-step.png", "loss-per-epoch.png", "accuracy.png", "lr.png"}
RUN_PLOTS = {"phases-per-rank.png", "phase-shares.png", "step-time.png", *CURVES}


def copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(DATA / name, tmp_path / name))


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


def check_page(path: Path, images: int) -> str:
    text = path.read_text()
    assert "http://" not in text and "https://" not in text and 'src="file' not in text and "<script" not in text
    assert len(re.findall(r'<img src="data:image/png;base64,', text)) == images
    return html.unescape(text).replace("\xa0", " ")  # as read: "41.2&nbsp;ms" is "41.2 ms"


def check_plots(folder: Path, names: set[str]) -> None:
    assert {p.name for p in folder.iterdir()} == names
    for p in folder.iterdir():
        with Image.open(p) as im:
            im.verify()


def test_run_report(tmp_path):
    run_dir = copy("run-a", tmp_path)
    before = digests(run_dir)
    path = write_run_report(run_dir)
    assert path == run_dir / "report.html"
    text = check_page(path, 7)
    check_plots(run_dir / "plots", RUN_PLOTS)
    for words in ("2 x 32 = 64", "41.2 ms (56%)", "76.7% of the communication is hidden", "10/10 steps",
                  "compute-bound", "392.9 MiB"):
        assert words in text, words
    after = digests(run_dir)  # only report.html and plots/ are new; every existing file is unchanged
    assert {k: v for k, v in after.items() if k in before} == before
    assert set(after) - set(before) == {"report.html", *(f"plots/{n}" for n in RUN_PLOTS)}
    write_run_report(run_dir)  # rebuilding is fine
    assert len(list(run_dir.iterdir())) == len(list((DATA / "run-a").iterdir())) + 2


def test_run_report_without_phases(tmp_path):
    run_dir = copy("run-noprofile", tmp_path)
    text = check_page(write_run_report(run_dir), 5)
    check_plots(run_dir / "plots", {"step-time.png", *CURVES})
    assert "phases were not recorded (the run used --profile off)" in text
    assert "phase plots are left out" in text


def test_run_report_of_a_run_that_never_finished(tmp_path):
    run_dir = copy("run-a", tmp_path)
    (run_dir / "summary.json").unlink()
    text = check_page(write_run_report(run_dir), 7)
    assert "no summary.json" in text and "unfinished" in text and "41.2 ms" in text


def test_study_report(tmp_path):
    study_dir = copy("study-a", tmp_path)
    text = check_page(write_study_report(study_dir), 4)
    check_plots(study_dir / "plots", {"epoch-time.png", "speedup.png", "workers-sweep.png", "phases-per-point.png"})
    assert "0:00:40" in text and "1.82x" in text and "91%" in text
    assert "nproc4-workers2 failed: rank 3 exited with code 1: RuntimeError: out of memory" in text
    assert "5 of 6 points completed, 1 failed" in text


def test_study_plots_of_a_single_valued_axis_are_left_out(tmp_path):
    study_dir = copy("study-a", tmp_path)
    points = [p for p in json.loads((study_dir / "study.json").read_text()) if p["axes"]["nproc"] == 2]
    (study_dir / "study.json").write_text(json.dumps(points))
    (study_dir / "study.toml").write_text("[axes]\nnproc = [2]\nworkers = [0, 2]\n")
    text = check_page(write_study_report(study_dir), 2)
    check_plots(study_dir / "plots", {"workers-sweep.png", "phases-per-point.png"})
    assert "epoch time and speedup against nproc: not drawn, nproc has only one value (2)" in text


def test_read_only_directory_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    run_dir = copy("run-a", tmp_path)
    monkeypatch.setattr(output.os, "access", lambda path, mode: False)  # as if read-only (tests may run as root)
    with pytest.raises(UserError, match=r"cannot write report.html and plots/ in .*\(permission denied\)"):
        write_run_report(run_dir)
    assert not (run_dir / "plots").exists() and not (run_dir / "report.html").exists()


def test_compare_page(tmp_path):
    a, b = load_run(DATA / "run-a"), load_run(DATA / "run-b")
    out = build.render_compare(compare_runs(overview(a), overview(b)), a, b, tmp_path / "cmp.html")
    text = check_page(out, 1)
    assert "backward: 41.2 ms -> 23.9 ms per step (-42%), the largest change" in text
    assert [p.name for p in tmp_path.iterdir()] == ["cmp.html"]


def test_report_of_a_recorded_run_agrees_with_its_summary(tmp_path):
    run_dir = copy("recorded-lenet5-2rank", tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    run = load_run(run_dir)
    for phase, seconds in summary["phases_mean_s"].items():  # recomputed from the metrics files, same numbers
        assert abs(run.analysis["phases_mean_s"][phase] - seconds) < 1e-9, phase
    text = check_page(write_run_report(run_dir), 7)
    assert summary["diagnosis"][0]["kind"] in text and f"{1000 * summary['phases_mean_s']['forward']:.1f} ms" in text


@pytest.mark.parametrize("name", ["run-a", "run-b", "run-noprofile", "recorded-lenet5-2rank"])
def test_training_curves_of_every_recorded_run_are_drawn_and_in_the_page(tmp_path, name):
    run_dir = copy(name, tmp_path)
    text = write_run_report(run_dir).read_text()
    for png in CURVES:
        path = run_dir / "plots" / png
        with Image.open(path) as im:
            im.verify()
        # the page embeds the very file written beside it
        assert base64.b64encode(path.read_bytes()).decode("ascii") in text, png
    page = html.unescape(text)
    for caption in ("training loss of every step on rank 0", "training loss (mean over the epoch) and validation loss",
                    "validation top-1 and top-5 accuracy after each evaluated epoch", "learning rate of every step"):
        assert f'alt="{caption}' in page, caption
    assert "<h2>training: loss, accuracy, learning rate</h2>" in page


def test_a_run_without_loss_accuracy_or_lr_gets_notes_not_empty_plots(tmp_path):
    run_dir = copy("run-noprofile", tmp_path)
    for f in run_dir.glob("metrics-rank*.jsonl"):
        lines = [json.loads(line) for line in f.read_text().splitlines()]
        f.write_text("".join(json.dumps({k: v for k, v in r.items() if k not in ("loss", "lr")}) + "\n" for r in lines))
    epochs = [json.loads(line) for line in (run_dir / "epochs.jsonl").read_text().splitlines()]
    (run_dir / "epochs.jsonl").write_text("".join(json.dumps({"epoch": e["epoch"], "epoch_time_s": e["epoch_time_s"]})
                                                  + "\n" for e in epochs))
    text = check_page(write_run_report(run_dir), 1)
    check_plots(run_dir / "plots", {"step-time.png"})
    for note in ("training loss per step: not drawn", "loss per epoch: not drawn", "validation accuracy: not drawn",
                 "learning rate: not drawn"):
        assert note in text, note
