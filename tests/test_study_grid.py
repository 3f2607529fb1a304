"""Tests for study grids: comma lists, the study TOML, merging, points and their ids, spec comparison."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from scaletrain.config import TrainConfig
from scaletrain.errors import UserError
from scaletrain.study.grid import (AXES, StudySpec, load_spec_file, parse_axis, point_id, points, resolve_spec,
                                   spec_difference, spec_toml, validate_points)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(text)
    return path


# ------------------------------------------------------------------ comma lists

def test_axis_values_take_the_field_type():
    assert parse_axis("nproc", "1,2, 4") == [1, 2, 4]
    assert parse_axis("precision", "fp32,bf16") == ["fp32", "bf16"]
    assert parse_axis("model", "mlp") == ["mlp"]


@pytest.mark.parametrize("name, text, needles", [
    ("workers", "0,x", ["--workers 0,x", "'x' is not an integer"]),
    ("nproc", "1,,2", ["--nproc", "empty value"]),
    ("workers", "0,-1", ["--workers", "0 or more"]),
    ("precision", "fp32,fp8", ["--precision", "fp8"]),
    ("batch_size", "64,64", ["batch_size lists 64 twice"]),
])
def test_bad_axis_values_are_one_clear_line(name, text, needles):
    with pytest.raises(UserError) as e:
        parse_axis(name, text)
    message = str(e.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


# ------------------------------------------------------------------ the study file

def test_study_file_reads_axes_train_and_repeats(tmp_path):
    path = write(tmp_path, 'repeats = 3\n[axes]\nnproc = [1, 2]\nbatch-size = 32\n'
                           '[train]\nepochs = 2\nlr = 0.05\nprecision = "bf16"\n')
    spec = load_spec_file(path)
    # a scalar axis is a one-value axis, and an axis under [train] is one too
    assert spec["axes"] == {"nproc": [1, 2], "batch_size": [32], "precision": ["bf16"]}
    assert spec["train"] == {"epochs": 2, "lr": 0.05}
    assert spec["repeats"] == 3


@pytest.mark.parametrize("text, needle", [
    ("[axes]\nlr = [0.1, 0.2]\n", "not a study axis"),
    ("[axes]\nnprocs = [1]\n", "did you mean 'nproc'"),
    ("[train]\nlearning_rate = 0.1\n", "did you mean 'lr'"),
    ("[train]\nout = 'x'\n", "set by the study"),
    ("epochs = 1\n", "unknown key 'epochs'"),
    ("repeats = 0\n", "repeats"),
    ("[axes]\nnproc = [1]\n[train]\nnproc = 2\n", "both in [axes] and [train]"),
    ("[axes]\nnproc = ['x']\n", 'nproc takes integers, got "x" (a string)'),
    ("[axes\n", "not valid TOML"),
])
def test_bad_study_files_are_user_errors(tmp_path, text, needle):
    with pytest.raises(UserError) as e:
        load_spec_file(write(tmp_path, text))
    assert needle in str(e.value)


def test_missing_study_file(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_spec_file(tmp_path / "nope.toml")


def test_flags_override_the_file_and_nproc_is_always_an_axis(tmp_path):
    file_spec = load_spec_file(write(tmp_path, 'repeats = 2\n[axes]\nworkers = [0, 2]\nmodel = ["mlp"]\n'
                                               "[train]\nepochs = 3\nlr = 0.5\n"))
    spec = resolve_spec(file_spec, {"workers": [1]}, {"lr": 0.2}, None)
    assert spec.axes == {"nproc": [1], "workers": [1], "model": ["mlp"]}  # in AXES order
    assert spec.train == {"epochs": 3, "lr": 0.2}
    assert spec.repeats == 2
    assert resolve_spec(file_spec, {}, {}, 5).repeats == 5
    assert resolve_spec(None, {}, {}, None).repeats == 1
    with pytest.raises(UserError, match="--repeats"):
        resolve_spec(None, {}, {}, 0)


def test_spec_toml_round_trips(tmp_path):
    spec = resolve_spec(None, {"nproc": [1, 2], "dataset": ["digits", "imagefolder:a/b"]},
                        {"epochs": 1, "augment": False}, 2)
    text = spec_toml(spec)
    assert "nproc = [1, 2]" in text
    assert tomllib.loads(text) == {"repeats": 2, "axes": spec.axes, "train": spec.train}
    again = resolve_spec(load_spec_file(write(tmp_path, text)), {}, {}, None)
    assert again == spec


# ------------------------------------------------------------------ points

def test_points_span_the_grid_with_nproc_fastest():
    spec = resolve_spec(None, {"nproc": [1, 2], "workers": [0, 1], "model": ["mlp"]}, {"epochs": 1}, None)
    pts = points(spec)
    assert [p.id for p in pts] == ["nproc1-workers0", "nproc2-workers0", "nproc1-workers1", "nproc2-workers1"]
    assert pts[1].axes == {"nproc": 2, "workers": 0, "model": "mlp"}
    assert isinstance(pts[1].config, TrainConfig)
    assert (pts[1].config.launch.nproc, pts[1].config.data.workers, pts[1].config.optim.epochs) == (2, 0, 1)
    settings = pts[1].settings()
    assert "out" not in settings and "progress" not in settings and settings["model"] == "mlp"


def test_each_point_is_validated_before_anything_runs():
    # each value is fine alone; the combination with the fixed settings is not
    spec = resolve_spec(None, {"nproc": [1, 2]}, {"epochs": 1, "warmup_epochs": 3.0}, None)
    with pytest.raises(UserError, match=r"study point nproc1 \(nproc=1\): --warmup-epochs"):
        points(spec)
    with pytest.raises(UserError, match="'lr' must be a float"):
        points(resolve_spec(None, {}, {"lr": "fast"}, None))


def test_every_point_gets_the_same_threads_per_rank():
    # by default a CPU rank takes cores / its point's processes: the 1-process baseline would run 2 threads
    # and the 2-process point 1 each, and the speedup would count the threads as well as the processes
    from scaletrain.study.grid import Threads, fair_threads

    spec = resolve_spec(None, {"nproc": [1, 2]}, {"model": "mlp"}, None)
    fair, threads = fair_threads(spec, cores=2)
    assert [p.config.launch.threads for p in points(fair)] == [1, 1]
    assert threads == Threads(threads=1, source="cores", cores=2, processes=2)
    assert [p.config.launch.threads for p in points(fair_threads(spec, cores=7)[0])] == [3, 3]  # 7 cores / 2, whole
    assert [p.config.launch.threads for p in points(fair_threads(spec, cores=1)[0])] == [1, 1]  # never below 1
    assert "threads" not in spec.train  # the spec given is left as it was


def test_threads_the_user_or_the_study_set_are_kept():
    from scaletrain.study.grid import fair_threads

    given = resolve_spec(None, {"nproc": [1, 2]}, {"threads": 2}, None)
    fair, threads = fair_threads(given, cores=16)
    assert [p.config.launch.threads for p in points(fair)] == [2, 2] and threads.source == "given"
    # resumed: the threads study.toml records, whatever this machine's cores (older studies: none, as then)
    spec = resolve_spec(None, {"nproc": [1, 2]}, {}, None)
    recorded = resolve_spec(None, {"nproc": [1, 2]}, {"threads": 4}, None)
    fair, threads = fair_threads(spec, cores=2, recorded=recorded)
    assert fair.train["threads"] == 4 and threads.source == "recorded"
    fair, threads = fair_threads(spec, cores=2, recorded=spec)
    assert "threads" not in fair.train and threads.threads is None and threads.source == "recorded"
    # on SLURM the cores are the node's: left to each job (slurm/study_jobs.py), by the same rule
    fair, threads = fair_threads(spec, cores=None)
    assert "threads" not in fair.train and threads.threads is None and threads.processes == 2


def test_point_ids_are_file_name_safe_and_distinct():
    assert point_id({"nproc": 2, "workers": 1, "model": "mlp"}, ["workers"]) == "nproc2-workers1"
    assert point_id({"nproc": 4, "precision": "bf16"}, ["precision"]) == "nproc4-precision_bf16"
    a = point_id({"nproc": 1, "dataset": "imagefolder:data/a-b"}, ["dataset"])
    b = point_id({"nproc": 1, "dataset": "imagefolder:data/a_b"}, ["dataset"])
    assert a != b
    for pid in (a, b):
        assert all(c.isalnum() or c in "._-" for c in pid) and "/" not in pid


def test_every_axis_is_a_train_setting():
    names = {f for f in TrainConfig().to_dict()}
    assert set(AXES) <= names


# ------------------------------------------------------------------ comparing specs

def test_same_points_and_settings_are_the_same_spec():
    a = resolve_spec(None, {"nproc": [1, 2]}, {"epochs": 1}, 1)
    b = resolve_spec(None, {"nproc": [1, 2]}, {"epochs": 1, "lr": TrainConfig().optim.lr}, 3)  # default spelt out
    assert spec_difference(a, b) is None


def test_a_different_axis_or_setting_is_named():
    a = resolve_spec(None, {"nproc": [1, 2]}, {"epochs": 1}, 1)
    assert "nproc: [1, 2] there, [1, 4] here" == spec_difference(a, resolve_spec(None, {"nproc": [1, 4]},
                                                                                   {"epochs": 1}, 1))
    assert "epochs: 1 there, 2 here" == spec_difference(a, resolve_spec(None, {"nproc": [1, 2]}, {"epochs": 2}, 1))
    assert "workers" in spec_difference(a, StudySpec(axes={"nproc": [1, 2], "workers": [0]}, train={"epochs": 1}))


# ------------------------------------------------------------------ every point checked before any launch

def test_every_point_is_validated_once_per_model_data_and_shape():
    spec = resolve_spec(None, {"nproc": [1, 2], "workers": [0, 2], "model": ["lenet5", "mlp"]}, {"epochs": 1}, None)
    grid = points(spec)
    seen = []
    assert validate_points(grid, lambda cfg: seen.append((cfg.model.name, cfg.launch.nproc, cfg.data.workers))) == 4
    # workers is not something validate reads: the workers=2 twin of each point is not built again
    assert sorted((m, n) for m, n, _ in seen) == [("lenet5", 1), ("lenet5", 2), ("mlp", 1), ("mlp", 2)]
    assert len(grid) == 8


def test_the_first_bad_point_is_named_with_its_axis_values():
    spec = resolve_spec(None, {"nproc": [1, 2], "model": ["lenet5", "nosuchnet"]}, {"epochs": 1}, None)

    def validate(cfg):
        if cfg.model.name == "nosuchnet":
            raise UserError("unknown model 'nosuchnet'")

    with pytest.raises(UserError) as e:
        validate_points(points(spec), validate)
    assert str(e.value) == "study point nproc1-model_nosuchnet (nproc=1, model=nosuchnet): unknown model 'nosuchnet'"


@pytest.mark.parametrize("text, needle", [
    ("[axes]\nfoo = [1]\n", "'foo' in [axes] of {path} is not a study axis (axes: nproc, workers, batch_size, "
                            "precision, dataset, model, strategy, compress, bucket_cap_mb, ps_servers, stages, "
                            "microbatches, pipeline_schedule, split, spatial, checkpoint_activations): vary one of "
                            "those, or drop it"),
    ("[axes]\nthreads = [1, 2]\n", "'threads' in [axes] of {path} is not a study axis (axes: nproc, workers, "
                                   "batch_size, precision, dataset, model, strategy, compress, bucket_cap_mb, "
                                   "ps_servers, stages, microbatches, pipeline_schedule, split, spatial, "
                                   "checkpoint_activations): put a fixed value under [train]"),
    ("[axes]\nworkers = [0, 1.5]\n", "[axes] of {path}: workers takes integers, got 1.5 (a number): write e.g. "
                                     "workers = [0] (study axes: nproc, workers, batch_size, precision, dataset, "
                                     "model, strategy, compress, bucket_cap_mb, ps_servers, stages, microbatches, "
                                     "pipeline_schedule, split, spatial, checkpoint_activations)"),
    ("[axes]\nbucket_cap_mb = [0.25, \"big\"]\n", "[axes] of {path}: --bucket-cap-mb 'big': give MiB (e.g. 0.5) or "
                                                   "auto"),
    ("[axes]\nmodel = [3]\n", '[axes] of {path}: model takes strings, got 3 (an integer): write e.g. model = '
                              '["resnet20"] (study axes:'),
    ("[axes]\nnproc = [[1, 2]]\n", "[axes] of {path}: nproc takes integers, got [1, 2] (a list)"),
    ("[axes]\nnproc = [true]\n", "[axes] of {path}: nproc takes integers, got true (true/false)"),
    ("axes = [1]\n", "'axes' in {path} must be a [axes] table of key = value lines (study axes: nproc, workers"),
])
def test_unknown_axes_and_values_of_the_wrong_type_name_the_known_axes(tmp_path, text, needle):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as e:
        load_spec_file(path)
    assert needle.format(path=path) in str(e.value) and "\n" not in str(e.value)
