"""--out (rundir.check_out): every command writes into a new or empty folder, or one holding its own kind of
result; never into a training run, a study or another command's result, and a refusal leaves nothing behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from scaletrain.cli import main
from scaletrain.errors import UserError
from scaletrain.predict import calibrate, calibration
from scaletrain.rundir import check_out, kinds_in

from predict_fixtures import fake_calibration

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes: equal before and after means nothing was touched."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(autouse=True)
def no_machine_calibration(tmp_path, monkeypatch):
    """This test's own calibration cache, empty: nothing is timed unless a test gives a calibration."""
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def run(tmp_path):
    """A reported training run: tests/data/run-a copied, with the report.html and plots/ `scaletrain report` adds."""
    run = tmp_path / "run"
    shutil.copytree(DATA / "run-a", run)
    (run / "report.html").write_text("<html>the run's report</html>")
    (run / "plots").mkdir()
    (run / "plots" / "phases.png").write_bytes(b"\x89PNG the run's plot")
    return run


@pytest.fixture(scope="module")
def cal_file(tmp_path_factory):
    """One thread, eight shapes per op kind: its laws fit in about a second."""
    cal = fake_calibration(threads=(1,))
    kept: dict[str, list] = {}
    for row in cal["layers"]:
        kept.setdefault(row["kind"], []).append(row)
    cal["layers"] = [row for rows in kept.values() for row in rows[:8]]
    return calibration.save(cal, tmp_path_factory.mktemp("cal") / "cal.json")


def refused(capsys, argv: list[str], words: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert words in err, err
    return err


def predict(cal_file, out) -> list[str]:
    return ["predict", "--calibration", str(cal_file), "--model", "lenet5", "--dataset", "synthetic",
            "--synthetic-samples", "256", "--nproc", "1", "--out", str(out)]


def graph(out) -> list[str]:
    return ["graph", "--model", "lenet5", "--batch-size", "2", "--out", str(out)]


def split(cal_file, out) -> list[str]:
    return ["split", "--model", "lenet5", "--stages", "2", "--batch-size", "8", "--microbatches", "2",
            "--costs", "predicted", "--calibration", str(cal_file), "--out", str(out)]


STUDY = ["study", "--model", "mlp", "--dataset", "synthetic", "--synthetic-samples", "256", "--nproc", "1",
         "--epochs", "1"]


# ------------------------------------------------------------------ what a folder holds

def test_kinds_are_named_from_the_files_each_command_writes(tmp_path):
    assert kinds_in(DATA / "run-a") == ["training run"]
    assert kinds_in(DATA / "study-a") == ["study"]
    assert kinds_in(tmp_path / "new") == [] and kinds_in(tmp_path) == []
    for name, kind in (("prediction.json", "prediction"), ("graph.json", "graph"), ("split.json", "split"),
                       ("validation.json", "validation"), ("commbench.json", "commbench result"),
                       ("metrics-rank3.jsonl", "training run")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / name).write_text("{}")
        assert kinds_in(folder) == [kind]


def test_check_out_accepts_new_empty_and_own_folders_and_writes_nothing(tmp_path):
    assert check_out(tmp_path / "new" / "p", "prediction") is False
    assert not (tmp_path / "new").exists()
    assert check_out(tmp_path, "prediction") is False
    (tmp_path / "prediction.json").write_text("{}")
    assert check_out(tmp_path, "prediction") is True
    with pytest.raises(UserError, match="holds a prediction"):
        check_out(tmp_path, "graph")


# ------------------------------------------------------------------ nothing writes into a training run

def test_predict_into_a_training_run_is_refused(run, cal_file, capsys):
    before = tree(run)
    err = refused(capsys, predict(cal_file, run), "holds a training run")
    assert "choose" in err and tree(run) == before  # its report.html above all


def test_predict_into_a_training_run_is_refused_before_calibrating(run, tmp_path, capsys):
    before = tree(run)
    refused(capsys, ["predict", "--model", "lenet5", "--out", str(run)], "holds a training run")
    assert tree(run) == before and not (tmp_path / "cache").exists()


def test_graph_into_a_training_run_is_refused(run, capsys):
    before = tree(run)
    refused(capsys, graph(run), "holds a training run")
    assert tree(run) == before


def test_split_into_a_training_run_is_refused(run, cal_file, capsys):
    before = tree(run)
    refused(capsys, split(cal_file, run), "holds a training run")
    assert tree(run) == before


def test_study_into_a_training_run_is_refused(run, capsys):
    before = tree(run)
    refused(capsys, [*STUDY, "--out", str(run)], "holds a training run")
    assert tree(run) == before


def test_commbench_into_a_training_run_is_refused(run, capsys):
    before = tree(run)
    refused(capsys, ["commbench", "--sizes", "1K", "--seconds", "0.01", "--out", str(run)], "holds a training run")
    assert tree(run) == before


def test_validate_into_a_training_run_is_refused(run, cal_file, tmp_path, capsys):
    assert main(predict(cal_file, tmp_path / "pred")) == 0
    point = json.loads((tmp_path / "pred" / "prediction.json").read_text())["points"][0]
    measured = tmp_path / "measured"  # a run that matches the prediction, so that only --out can be wrong
    measured.mkdir()
    (measured / "config.toml").write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in point["config"].items()
                                                    if v is not None and not isinstance(v, dict)) + "\n")
    (measured / "summary.json").write_text(json.dumps({"status": "completed", "step_time_mean_s": 0.1,
                                                       "phases_mean_s": point["phases_s"], "samples_per_s": 1.0}))
    before = tree(run)
    refused(capsys, ["validate", str(tmp_path / "pred"), str(measured), "--out", str(run)], "holds a training run")
    assert tree(run) == before


def test_train_names_what_a_folder_holds(tmp_path, capsys):
    (tmp_path / "pred").mkdir()
    (tmp_path / "pred" / "prediction.json").write_text("{}")
    refused(capsys, ["train", "--model", "mlp", "--out", str(tmp_path / "pred")], "holds a prediction")
    assert [p.name for p in (tmp_path / "pred").iterdir()] == ["prediction.json"]


# ------------------------------------------------------------------ calibrate's --out is a file

@pytest.fixture
def fake_measure(monkeypatch):
    """calibrate measures nothing: the made-up calibration, at once (what is tested is where it goes)."""
    monkeypatch.setattr(calibrate, "calibrate", lambda **kw: fake_calibration())


@pytest.mark.parametrize("name", ["summary.json", "report.html", "config.toml", "."])
def test_calibrate_over_a_training_runs_file_is_refused(run, fake_measure, capsys, name):
    before = tree(run)
    refused(capsys, ["calibrate", "--quick", "--out", str(run / name)], "training run")
    assert tree(run) == before


def test_calibrate_replaces_a_calibration_and_nothing_else(tmp_path, fake_measure, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    refused(capsys, ["calibrate", "--quick", "--out", str(notes)], "not a calibration")
    assert notes.read_text() == "mine"
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"kind": calibration.KIND, "format": 0}))  # an old one of ours: replaced
    assert main(["calibrate", "--quick", "--out", str(cal)]) == 0
    assert calibration.load(cal)["format"] == calibration.FORMAT


# ------------------------------------------------------------------ each command and its own kind

def test_a_command_replaces_its_own_result(cal_file, tmp_path):
    for argv in (predict(cal_file, tmp_path / "p"), graph(tmp_path / "g"), split(cal_file, tmp_path / "s")):
        assert main(argv) == 0
        assert main(argv) == 0


def test_results_of_other_commands_are_refused(cal_file, tmp_path, capsys):
    for folder, files in (("p", ("prediction.json", "report.html")), ("g", ("graph.json", "graph.dot"))):
        (tmp_path / folder).mkdir()
        for name in files:
            (tmp_path / folder / name).write_text(f"{folder}'s {name}")
    study = tmp_path / "study"
    shutil.copytree(DATA / "study-a", study)
    for argv, words in ((graph(tmp_path / "p"), "holds a prediction"), (predict(cal_file, tmp_path / "g"), "holds a graph"),
                        (split(cal_file, tmp_path / "g"), "holds a graph"), (split(cal_file, study), "holds a study"),
                        (predict(cal_file, study), "holds a study")):
        before = {p: tree(tmp_path / p) for p in ("p", "g", "study")}
        refused(capsys, argv, words)
        assert {p: tree(tmp_path / p) for p in ("p", "g", "study")} == before


def test_a_folder_with_other_files_is_refused(cal_file, tmp_path, capsys):
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "holiday.jpg").write_bytes(b"not ours")
    for argv in (predict(cal_file, photos), graph(photos), split(cal_file, photos)):
        refused(capsys, argv, "is a folder with other files in it")
    assert [p.name for p in photos.iterdir()] == ["holiday.jpg"]


# ------------------------------------------------------------------ a refusal leaves nothing behind

def test_study_predict_with_a_file_that_is_no_calibration_leaves_nothing(tmp_path, capsys):
    out = tmp_path / "study"
    refused(capsys, [*STUDY, "--predict", "--calibration", str(ROOT / "README.md"), "--out", str(out)],
            "is not a calibration file")
    assert not out.exists()
