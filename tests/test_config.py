"""Tests for the training configuration: validation, TOML loading, precedence, type checks, round trip."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import (OPTIMIZERS, PRECISIONS, SCHEDULES, SECTIONS, TrainConfig, build_config, field_names,
                               load_toml, save_toml)
from scaletrain.errors import UserError


def write(tmp_path, text: str, name: str = "c.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------------------------ validation

def test_defaults_are_valid_and_documented_values():
    cfg = TrainConfig()
    assert cfg.model.name == "resnet20" and cfg.data.dataset == "digits"
    assert cfg.optim.optimizer in OPTIMIZERS and cfg.model.precision in PRECISIONS and cfg.optim.schedule in SCHEDULES
    assert build_config({}, {}) == cfg
    assert set(cfg.to_dict()) == set(field_names())


@pytest.mark.parametrize("field, value, flag", [
    ("batch_size", 0, "--batch-size"),
    ("batch_size", -3, "--batch-size"),
    ("epochs", 0, "--epochs"),
    ("nproc", 0, "--nproc"),
    ("ref_batch", 0, "--ref-batch"),
    ("eval_every", 0, "--eval-every"),
    ("synthetic_samples", 0, "--synthetic-samples"),
    ("synthetic_classes", 0, "--synthetic-classes"),
    ("optimizer", "adam", "--optimizer"),
    ("precision", "fp8", "--precision"),
    ("schedule", "linear", "--schedule"),
    ("bad_images", "ignore", "--bad-images"),
    ("device", "gpu", "--device"),
    ("workers", -1, "--workers"),
    ("lr", 0.0, "--lr"),
    ("lr", -0.1, "--lr"),
    ("warmup_epochs", 11.0, "--warmup-epochs"),
    ("warmup_epochs", -0.5, "--warmup-epochs"),
    ("image_size", 0, "--image-size"),
    ("width", 0.0, "--width"),
    ("stop_after", 0, "--stop-after"),
    ("threads", 0, "--threads"),
    ("master_port", 0, "--master-port"),
    ("master_port", 65536, "--master-port"),
])
def test_each_invalid_value_is_a_user_error_naming_the_flag(field, value, flag):
    with pytest.raises(UserError) as e:
        TrainConfig.from_dict({field: value})
    msg = str(e.value)
    assert msg.startswith(flag + " ")
    assert repr(value) in msg or str(value) in msg


def test_choice_errors_list_the_valid_choices():
    with pytest.raises(UserError, match="sgd, nesterov, adagrad, adamw"):
        TrainConfig.from_dict(dict(optimizer="adam"))


def test_warmup_limit_is_relative_to_epochs():
    with pytest.raises(UserError, match=r"--epochs \(3\)"):
        TrainConfig.from_dict(dict(epochs=3, warmup_epochs=3.5))


@pytest.mark.parametrize("kw", [
    dict(batch_size=1), dict(epochs=1), dict(nproc=1), dict(workers=0), dict(warmup_epochs=10.0),
    dict(epochs=2, warmup_epochs=2.0), dict(warmup_epochs=0.0), dict(master_port=1), dict(master_port=65535),
    dict(image_size=1), dict(stop_after=1), dict(threads=1), dict(optimizer="adamw", precision="bf16",
                                                                    schedule="step", bad_images="skip",
                                                                    dataset="imagefolder:data", device="cpu"),
])
def test_boundary_values_are_accepted(kw):
    cfg = TrainConfig.from_dict(kw)
    for k, v in kw.items():
        assert cfg.to_dict()[k] == v


# ------------------------------------------------------------------ load_toml

def test_load_missing_file_names_it(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(UserError) as e:
        load_toml(missing)
    assert str(missing) in str(e.value) and "--config" in str(e.value)


def test_load_directory_is_not_a_config(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_toml(tmp_path)


def test_load_invalid_toml_names_the_file(tmp_path):
    p = write(tmp_path, "epochs = = 3\n", name="broken.toml")
    with pytest.raises(UserError) as e:
        load_toml(p)
    assert "broken.toml" in str(e.value) and "not valid TOML" in str(e.value)


def test_load_reads_values_with_their_toml_types(tmp_path):
    p = write(tmp_path, 'epochs = 3\nlr = 0.5\nmodel = "mlp"\naugment = false\n')
    assert load_toml(p) == {"epochs": 3, "lr": 0.5, "model": "mlp", "augment": False}


def test_misspelt_key_suggests_the_right_one(tmp_path):
    p = write(tmp_path, "batchsize = 32\n")
    with pytest.raises(UserError) as e:
        load_toml(p)
    assert "unknown key 'batchsize'" in str(e.value)
    assert "did you mean 'batch_size'?" in str(e.value)
    assert str(p) in str(e.value)


def test_misspelt_hyphenated_key_suggests_the_underscore_name(tmp_path):
    p = write(tmp_path, "warmup-epoch = 1\n")
    with pytest.raises(UserError, match="unknown key 'warmup-epoch'.*did you mean 'warmup_epochs'"):
        load_toml(p)


@pytest.mark.parametrize("key, suggestion", [
    ("lerning_rate", "lr"),        # close to another tool's name for lr
    ("learning_rate", "lr"),
    ("num_workers", "workers"),
    ("output_dir", "out"),
    ("optimiser", "optimizer"),
])
def test_other_tools_names_suggest_our_key(tmp_path, key, suggestion):
    p = write(tmp_path, f"{key} = 1\n")
    with pytest.raises(UserError) as e:
        load_toml(p)
    assert f"unknown key '{key}'" in str(e.value)
    assert f"did you mean '{suggestion}'?" in str(e.value)


def test_unknown_key_without_close_match_lists_known_keys(tmp_path):
    p = write(tmp_path, "zzqx = 0.1\n")
    with pytest.raises(UserError) as e:
        load_toml(p)
    msg = str(e.value)
    assert "unknown key 'zzqx'" in msg and "did you mean" not in msg
    assert "known keys:" in msg
    listed = msg.split("known keys:")[1].split(", ")
    assert [k.strip() for k in listed] == field_names()


def test_hyphenated_keys_are_accepted(tmp_path):
    p = write(tmp_path, 'batch-size = 32\nwarmup-epochs = 1.5\nbad-images = "skip"\n')
    assert load_toml(p) == {"batch_size": 32, "warmup_epochs": 1.5, "bad_images": "skip"}


def test_train_table_is_accepted(tmp_path):
    p = write(tmp_path, '[train]\nepochs = 4\nmodel = "lenet5"\n')
    assert load_toml(p) == {"epochs": 4, "model": "lenet5"}


def test_train_table_beside_top_level_keys_is_an_unknown_key(tmp_path):
    p = write(tmp_path, 'epochs = 4\n[train]\nlr = 0.2\n')
    with pytest.raises(UserError, match="unknown key 'train'"):
        load_toml(p)


def test_lone_train_key_that_is_not_a_table_is_a_user_error(tmp_path):
    p = write(tmp_path, "train = 5\n")
    with pytest.raises(UserError):
        load_toml(p)


# ------------------------------------------------------------------ build_config

def test_overrides_beat_file_values_which_beat_defaults():
    cfg = build_config({"epochs": 3, "lr": 0.5, "model": "mlp"}, {"lr": 0.2, "batch_size": 16})
    assert (cfg.optim.epochs, cfg.optim.lr, cfg.model.name, cfg.optim.batch_size) == (3, 0.2, "mlp", 16)
    assert cfg.optim.momentum == TrainConfig().optim.momentum


def test_int_is_widened_to_float_for_float_fields():
    cfg = build_config({"lr": 1, "warmup_epochs": 2}, {"width": 2})
    assert cfg.optim.lr == 1.0 and type(cfg.optim.lr) is float
    assert type(cfg.optim.warmup_epochs) is float and type(cfg.model.width) is float


@pytest.mark.parametrize("key, value", [
    ("epochs", "ten"),
    ("epochs", True),       # bool is an int subclass, but not an int here
    ("epochs", 2.5),
    ("epochs", None),       # not an optional field
    ("lr", True),
    ("lr", "0.1"),
    ("augment", 1),
    ("model", 3),
    ("image_size", "32"),
    ("stop_after", False),
])
def test_wrong_types_are_rejected_naming_the_key(key, value):
    with pytest.raises(UserError) as e:
        build_config({key: value}, {})
    assert f"'{key}'" in str(e.value) and repr(value) in str(e.value)


def test_wrong_type_in_overrides_is_rejected_too():
    with pytest.raises(UserError, match="'batch_size' must be"):
        build_config({}, {"batch_size": "64"})


@pytest.mark.parametrize("key", ["image_size", "stop_after", "out", "threads", "master_port"])
def test_none_is_allowed_for_optional_fields(key):
    cfg = build_config({key: None}, {})
    assert cfg.to_dict()[key] is None


def test_override_with_none_resets_an_optional_file_value():
    cfg = build_config({"image_size": 28}, {"image_size": None})
    assert cfg.data.image_size is None


def test_build_config_runs_validation():
    with pytest.raises(UserError, match="--epochs"):
        build_config({"epochs": 0}, {})


# ------------------------------------------------------------------ save_toml

def test_save_toml_round_trips_to_an_equal_config(tmp_path):
    cfg = TrainConfig.from_dict(dict(model="mlp", dataset="imagefolder:/data/x", width=0.5, augment=False, epochs=7,
                      batch_size=32, optimizer="adamw", lr=0.003, warmup_epochs=1.5, schedule="step",
                      precision="bf16", stop_after=2, out="runs/a", resume=True, threads=3, master_port=29500))
    p = tmp_path / "config.toml"
    save_toml(cfg, p)
    back = build_config(load_toml(p), {})
    # the run's settings round-trip; the invocation's (resume, stop_after) are not the run's and stay out
    assert back == cfg.replace(resume=False, stop_after=None)
    assert p.read_text().startswith("#")


def test_save_toml_omits_none_fields_and_round_trips(tmp_path):
    cfg = TrainConfig.from_dict(dict(epochs=2))
    assert cfg.data.image_size is None and cfg.launch.out is None
    p = tmp_path / "config.toml"
    save_toml(cfg, p)
    values = load_toml(p)
    none_fields = {k for k, v in cfg.to_dict().items() if v is None}
    assert none_fields and not none_fields & set(values)
    assert set(values) == set(field_names()) - none_fields - {"resume"}
    assert build_config(values, {}) == cfg


@pytest.mark.parametrize("name", ["lr", "width"])
def test_nan_is_refused(name):
    with pytest.raises(UserError, match=name):
        TrainConfig.from_dict({name: float("nan")})


# --- profiler settings -------------------------------------------------------------------------
from scaletrain.config import Injection, parse_inject, torch_profile_window  # noqa: E402


def test_inject_parses_every_item():
    assert parse_inject("data=0.002,comm=0.05,slow-rank=1:0.03") == Injection(0.002, 0.05, 1, 0.03)
    assert parse_inject(None) == Injection()


@pytest.mark.parametrize("spec, message", [("disk=1", "unknown item 'disk=1'"), ("data=fast", "cannot read"),
                                           ("slow-rank=1", "cannot read"), ("comm=-1", "not negative")])
def test_bad_inject_is_one_clear_line(spec, message):
    with pytest.raises(UserError, match=message):
        TrainConfig.from_dict(dict(inject=spec))


def test_torch_profile_window_parsing():
    assert torch_profile_window("10:15") == (10, 15)
    for bad in ("10", "5:5", "a:b", "-1:3"):
        with pytest.raises(UserError, match="--torch-profile"):
            TrainConfig.from_dict(dict(torch_profile=bad))


@pytest.mark.parametrize("field, value", [("profile", "maybe"), ("tensorboard", "yes"), ("diag_input", 1.5),
                                          ("diag_comm", 0.0), ("bucket_cap_mb", 0.0)])
def test_profiler_settings_are_validated(field, value):
    with pytest.raises(UserError, match=field.replace("_", "-")):
        TrainConfig.from_dict({field: value})


# ------------------------------------------------------------------ nested sections, flat keys, the layout

def test_sections_are_typed_attributes_and_the_keys_stay_flat():
    cfg = build_config({}, {"model": "mlp", "strategy": "ps-async", "ps_servers": 2, "ps_fetch": 3, "lr": 0.2,
                            "profile": "off", "nproc": 4})
    assert (cfg.model.name, cfg.strategy.name, cfg.ps.servers, cfg.ps.fetch, cfg.optim.lr, cfg.profile.step_profiler,
            cfg.launch.nproc) == ("mlp", "ps-async", 2, 3, 0.2, "off", 4)
    flat = cfg.to_dict()
    assert (flat["model"], flat["strategy"], flat["ps_servers"], flat["profile"]) == ("mlp", "ps-async", 2, "off")
    assert list(flat) == field_names() and TrainConfig.from_dict(flat) == cfg
    assert [f.name for f in dataclasses.fields(TrainConfig)] == list(SECTIONS)


def test_replace_checks_anew_and_refuses_an_unknown_key():
    cfg = build_config({}, {"strategy": "pipeline", "nproc": 4, "batch_size": 8})
    assert cfg.replace(microbatches=2).pipeline.microbatches == 2 and cfg.pipeline.microbatches == 4
    with pytest.raises(UserError, match="--microbatches 3 does not divide --batch-size 8"):
        cfg.replace(microbatches=3)
    with pytest.raises(TypeError, match="no setting microbatch"):
        cfg.replace(microbatch=2)


@pytest.mark.parametrize("settings, layout", [
    ({"nproc": 4}, dict(world=4, servers=0, stages=1, trainers=4, replicas=4)),
    ({"nproc": 3, "nnodes": 2, "master_port": 29500}, dict(world=6, servers=0, stages=1, trainers=6, replicas=6)),
    ({"nproc": 5, "strategy": "ps-sync", "ps_servers": 2}, dict(world=5, servers=2, stages=1, trainers=3, replicas=3)),
    ({"nproc": 4, "strategy": "pipeline"}, dict(world=4, servers=0, stages=4, trainers=4, replicas=1)),
    ({"nproc": 6, "strategy": "pipeline", "stages": 2}, dict(world=6, servers=0, stages=2, trainers=6, replicas=3)),
    ({"nproc": 4, "strategy": "fsdp"}, dict(world=4, servers=0, stages=1, trainers=4, replicas=4)),
])
def test_the_layout_divides_the_ranks_as_the_strategy_does(settings, layout):
    got = build_config({}, settings).layout
    assert {k: getattr(got, k) for k in layout} == layout


@pytest.mark.parametrize("settings, needle", [
    ({"nproc": 6, "strategy": "pipeline", "stages": 4}, "needs a multiple of 4 processes"),
    ({"nproc": 1, "strategy": "pipeline"}, "needs at least 2 processes"),
    ({"nproc": 2, "strategy": "ps-sync", "ps_servers": 2},
     "--strategy ps-sync with --ps-servers 2 needs more processes than servers"),
    ({"nproc": 2, "inject": "slow-rank=2:0.1"}, "there are only 2 ranks"),
])
def test_a_layout_the_strategy_cannot_run_is_refused_at_launch(settings, needle):
    cfg = build_config({}, settings)  # each setting is valid alone: the launch's shape decides
    with pytest.raises(UserError, match=needle):
        cfg.check_launch()


@pytest.mark.parametrize("settings, needle", [
    ({"strategy": "ps-sync", "precision": "fp16"}, "fp16 is not supported with --strategy ps-sync"),
    ({"strategy": "pipeline", "sync_bn": True}, "--sync-bn is not supported with --strategy pipeline"),
])
def test_a_strategys_options_section_checks_the_rest_of_the_configuration(settings, needle):
    with pytest.raises(UserError, match=needle):
        build_config({}, settings)
