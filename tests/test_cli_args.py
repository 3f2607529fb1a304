"""Tests for the command-line parser (in-process): flags, help texts, precedence, resume, exit codes."""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import textwrap
from dataclasses import fields
from pathlib import Path

import pytest

import scaletrain
from scaletrain.cli import build_parser, main
from scaletrain.train.cli import train_config
from scaletrain.config.flags import add_train_args, field_help, listed
from scaletrain.config import SECTIONS, TrainConfig, config_fields, field_names, save_toml
from scaletrain.config.fields import setting_key
from scaletrain.errors import UserError


def train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scaletrain train")
    add_train_args(p)
    return p


def actions_by_dest(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in p._actions}


def cfg_of(*argv: str) -> TrainConfig:
    return train_config(build_parser().parse_args(["train", *argv]))


def field_docstrings() -> dict[str, str]:
    """Independently of config.flags.field_help: pair each section's field with the string literal right below it."""
    out = {}
    for section in SECTIONS.values():
        out.update(_docstrings_of(section))
    return {k: v for k, v in out.items() if k in field_names()}  # (a section's parsed values are not flags)


def _docstrings_of(section) -> dict[str, str]:
    keys = {f.name: setting_key(f) for f in fields(section)}
    body = ast.parse(textwrap.dedent(inspect.getsource(section))).body[0].body
    out = {}
    for i, node in enumerate(body[:-1]):
        if isinstance(node, ast.AnnAssign):
            out[keys[node.target.id]] = ast.literal_eval(body[i + 1].value)
    return out


# ------------------------------------------------------------------ flags and help

def test_every_field_has_a_flag():
    opts = {s for a in train_parser()._actions for s in a.option_strings}
    for name in field_names():
        assert "--" + name.replace("_", "-") in opts, name
    assert "--config" in opts


def test_bool_fields_have_a_negative_flag():
    p = train_parser()
    assert p.parse_args(["--no-augment"]).augment is False
    assert p.parse_args(["--augment"]).augment is True
    assert p.parse_args(["--no-progress", "--sync-bn"]).progress is False


def test_flags_parse_to_the_field_types():
    ns = train_parser().parse_args(["--epochs", "3", "--lr", "1", "--model", "mlp", "--image-size", "28"])
    assert ns.epochs == 3 and type(ns.epochs) is int
    assert ns.lr == 1.0 and type(ns.lr) is float
    assert ns.model == "mlp" and ns.image_size == 28


def test_unparsable_flag_value_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        train_parser().parse_args(["--epochs", "ten"])
    assert e.value.code == 2
    assert "--epochs" in capsys.readouterr().err


def test_help_texts_are_the_field_docstrings():
    docs = field_docstrings()
    assert set(docs) == set(field_names())
    helps = field_help()
    assert helps == {k: v.replace("%", "%%") for k, v in docs.items()}
    assert helps["lr"] == "Base learning rate (before the linear scaling rule)."
    acts = actions_by_dest(train_parser())
    for f in config_fields():
        a = acts[setting_key(f)]
        if str(f.type) == "bool":
            assert a.help == helps[setting_key(f)]
        else:  # values from a registry
            assert a.help == f"{helps[setting_key(f)]}{listed(setting_key(f))} (default: {f.default})"


def test_strategy_help_lists_every_registered_strategy():
    from scaletrain.comm.registry import STRATEGIES
    from scaletrain.study.cli import add_study_args

    study = argparse.ArgumentParser()
    add_study_args(study)
    for parser in (train_parser(), study):
        text = actions_by_dest(parser)["strategy"].help
        missing = [n for n in STRATEGIES if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)]
        assert missing == [], text


def test_formatted_help_shows_docstrings_with_percent_signs():
    text = " ".join(train_parser().format_help().split())
    assert "x0.1 at 50% and 75% of training" in text  # '%' survives argparse's %-formatting
    assert "Per-process batch size" in text


def test_nothing_given_means_no_overrides():
    ns = build_parser().parse_args(["train"])
    assert {k for k in vars(ns)} == {"command", "config"}
    assert ns.config is None


# ------------------------------------------------------------------ train_config precedence

def test_only_given_flags_override_the_config_file(tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text('epochs = 3\nlr = 0.5\nmodel = "mlp"\naugment = false\n')
    cfg = cfg_of("--config", str(conf), "--lr", "0.2", "--batch-size", "8")
    assert (cfg.optim.epochs, cfg.optim.lr, cfg.model.name, cfg.data.augment, cfg.optim.batch_size) == (3, 0.2, "mlp",
                                                                                                        False, 8)
    assert cfg.optim.optimizer == TrainConfig().optim.optimizer


def test_bool_flag_overrides_the_config_file(tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text("augment = false\n")
    assert cfg_of("--config", str(conf)).data.augment is False
    assert cfg_of("--config", str(conf), "--augment").data.augment is True


def test_out_defaults_to_a_run_folder():
    cfg = cfg_of("--model", "lenet5")
    assert cfg.launch.out is not None
    out = Path(cfg.launch.out)
    assert out.parent == Path("runs") and out.name.startswith("lenet5-digits-")


def test_config_file_errors_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        cfg_of("--config", str(tmp_path / "missing.toml"))


def test_resume_without_out_is_a_user_error():
    with pytest.raises(UserError, match="--resume needs --out"):
        cfg_of("--resume")


def test_resume_takes_the_saved_config_as_base_and_flags_override_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    save_toml(TrainConfig.from_dict(dict(model="mlp", epochs=7, lr=0.3, batch_size=16, out=str(run))),
              run / "config.toml")
    cfg = cfg_of("--resume", "--out", str(run), "--epochs", "9")
    assert cfg.launch.resume is True and cfg.launch.out == str(run)
    assert (cfg.model.name, cfg.optim.lr, cfg.optim.batch_size) == ("mlp", 0.3, 16)
    assert cfg.optim.epochs == 9


def test_resume_does_not_inherit_the_saved_stop_after(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    save_toml(TrainConfig.from_dict(dict(epochs=6, stop_after=2, out=str(run))), run / "config.toml")
    assert cfg_of("--resume", "--out", str(run)).launch.stop_after is None
    assert cfg_of("--resume", "--out", str(run), "--stop-after", "3").launch.stop_after == 3


def test_resume_config_file_sits_between_saved_config_and_flags(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    save_toml(TrainConfig.from_dict(dict(model="mlp", epochs=7, lr=0.3, out=str(run))), run / "config.toml")
    conf = tmp_path / "more.toml"
    conf.write_text(f'epochs = 12\nlr = 0.05\nout = "{run}"\n')
    cfg = cfg_of("--resume", "--config", str(conf), "--lr", "0.01")
    assert (cfg.model.name, cfg.optim.epochs, cfg.optim.lr, cfg.launch.out) == ("mlp", 12, 0.01, str(run))


def test_resume_without_a_saved_config_uses_defaults_and_flags(tmp_path):
    cfg = cfg_of("--resume", "--out", str(tmp_path), "--epochs", "2")
    assert cfg.launch.resume and cfg.optim.epochs == 2 and cfg.model.name == TrainConfig().model.name


# ------------------------------------------------------------------ main

def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"scaletrain {scaletrain.__version__}"


def test_a_command_is_required(capsys):
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2


def test_models_prints_a_table(capsys):
    assert main(["models", "--image-size", "32"]) == 0
    out = capsys.readouterr().out
    for name in ("resnet20", "lenet5", "mlp"):
        assert name in out


def test_models_rejects_a_zero_size(capsys):
    assert main(["models", "--image-size", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "--image-size" in err


def test_train_with_bad_value_exits_2_with_one_error_line(capsys):
    assert main(["train", "--batch-size", "0"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: --batch-size")
    assert captured.out == ""
