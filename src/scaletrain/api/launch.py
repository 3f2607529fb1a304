"""`train`, `study` and `predict` from Python: the commands' settings as keyword arguments, checked by the
code their flags and TOML keys go through, and what they wrote read back as typed results (docs/api.md)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from scaletrain.api.results import Prediction, Run, Study, load_prediction, load_run, load_study
from scaletrain.distributed.launch.spawned import refuse_in_spawned_import
from scaletrain.errors import UserError


class RunFailed(RuntimeError):
    """A training launch that ended without finishing; the message is the launcher's one line, `path` the
    run directory (its summary.json, and errors/rank{r}.txt with each failed rank's traceback)."""

    def __init__(self, message: str, path: Path) -> None:
        super().__init__(message)
        self.path = path


def train(config: str | os.PathLike | None = None, **settings: Any) -> Run:
    """`scaletrain train`: `settings` are its flags (`model="resnet20", nproc=2, batch_size=64`), `config`
    a TOML file they override; returns the run once it has ended. Bad input raises UserError before
    anything is written; a run that fails raises RunFailed."""
    refuse_in_spawned_import("scaletrain.api.train()")
    from scaletrain.config import resolve_train_config
    from scaletrain.distributed.allocator import settle
    from scaletrain.distributed.launch import start

    where = "scaletrain.api.train()"
    cfg = resolve_train_config(_settings(settings, where), _file(config))
    settle()  # as the command does, before anything is allocated for training (distributed/allocator.py)
    code = start.train(cfg)
    return _ended(code, Path(cfg.launch.out))


def study(out: str | os.PathLike, config: str | os.PathLike | None = None, repeats: int | None = None,
          predict: bool = False, calibration: str | os.PathLike | None = None, **settings: Any) -> Study:
    """`scaletrain study --out OUT`: a list is an axis (`nproc=[1, 2]`), one value a fixed setting, as in a
    study TOML (`config`, which they override); rerunning the same call resumes. Returns the study, failed
    points included (`Study.failed`); bad input raises UserError before anything is launched."""
    refuse_in_spawned_import("scaletrain.api.study()")
    from scaletrain.distributed.allocator import settle
    from scaletrain.study.cli import run_study
    from scaletrain.study.grid import AXES, load_spec_file, resolve_spec

    where = "scaletrain.api.study()"
    axes, fixed = _grid(settings, AXES, where)
    spec = resolve_spec(load_spec_file(_file(config)) if config else None, axes, fixed, repeats)
    settle()
    args = argparse.Namespace(out=_file(out), dry_run=False, predict=predict, calibration=_file(calibration))
    code = run_study(args, spec)
    if code == 130:
        raise KeyboardInterrupt
    return load_study(out)


def predict(out: str | os.PathLike, config: str | os.PathLike | None = None, *,
            calibration: str | os.PathLike | None = None, hardware: str | None = None, link: str | None = None,
            latency: str | None = None, network: str | os.PathLike | None = None, global_batch: int | None = None,
            probe: str = "off", shared_cores: int | None = None, **settings: Any) -> Prediction:
    """`scaletrain predict --out OUT`: lists are axes (`nproc=[1, 2, 4], nnodes=[1, 2]`), one value a fixed
    setting; the other keywords are the command's own flags. Returns the prediction it wrote."""
    refuse_in_spawned_import("scaletrain.api.predict()")
    from scaletrain.distributed.allocator import settle
    from scaletrain.predict.cli import PREDICT_AXES_EXTRA, predict_spec, run_predict
    from scaletrain.study.grid import AXES

    where = "scaletrain.api.predict()"
    axes, fixed = _grid(settings, (*AXES, *PREDICT_AXES_EXTRA), where)
    spec = predict_spec(_file(config), axes, fixed)
    settle()  # (a first calibration of this machine times its layers)
    args = argparse.Namespace(out=_file(out), config=_file(config), calibration=_file(calibration), hardware=hardware,
                              link=link, latency=latency, network=_file(network), global_batch=global_batch,
                              probe=probe, shared_cores=shared_cores)
    run_predict(args, spec)
    return load_prediction(out)


def _file(path: str | os.PathLike | None) -> str | None:
    return None if path is None else os.fspath(path)


def _settings(settings: dict[str, Any], where: str) -> dict[str, Any]:
    """{field: value} of keyword settings: `batch_size` or the flag's spelling; paths as strings."""
    from scaletrain.config.io import setting_name

    return {setting_name(key, where): os.fspath(v) if isinstance(v, os.PathLike) else v
            for key, v in settings.items()}


def _grid(settings: dict[str, Any], axis_names: tuple[str, ...], where: str) -> tuple[dict[str, list], dict]:
    """(axes, fixed settings) as a study TOML's [axes] and [train]: a list or tuple is an axis's values,
    checked as the study checks them; one value of an axis is an axis of one value."""
    from scaletrain.study.grid import AXES, STUDY_OWNED, check_axis_values

    axes, fixed = {}, {}
    for name, value in _settings(settings, where).items():
        if name in STUDY_OWNED:
            raise UserError(f"'{name}' in {where} is set by the study for each run: leave it out")
        if isinstance(value, (list, tuple)):
            if name not in axis_names:
                raise UserError(f"{name}={list(value)!r} in {where}: {name} is not an axis (axes: "
                                f"{', '.join(axis_names)}); give it one value")
            axes[name] = list(value)
        elif name in axis_names:
            axes[name] = [value]
        else:
            fixed[name] = value
    for name, values in axes.items():
        if name in AXES:  # (predict's nnodes is checked by predict_spec)
            check_axis_values(name, values, where)
    return axes, fixed


def _ended(code: int, out: Path) -> Run:
    """The run after its launch returned `code`: read back, or the launcher's one line raised."""
    from scaletrain.distributed.launch.local import PREEMPTED
    from scaletrain.rundir import read_summary

    if code in (0, PREEMPTED):  # completed or stopped; preempted: checkpointed, `resume=True` continues it
        return load_run(out)
    if code > 128:  # the launcher stopped the workers on Ctrl-C or a signal, and said how to resume
        raise KeyboardInterrupt
    summary = read_summary(out) or {}
    message = summary.get("error") or f"the training launch exited with code {code}: see the lines it printed"
    if code == 2:  # bad input that only a worker could find (a corrupt image, a model that fails to build)
        raise UserError(message)
    raise RunFailed(message, out)
