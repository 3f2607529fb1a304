"""Reading what `scaletrain validate` compares: a prediction.json, and runs or studies as MeasuredRun records.

Measurements come from each run's summary.json (the steady-state means the trainer wrote) and its
configuration from config.toml; nothing is recomputed, written or rerun.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scaletrain.errors import UserError
from scaletrain.report import schema
from scaletrain.report.load import kind_of, load_study, read_toml
from scaletrain.rundir import PREDICTION, RunDir, read_summary
from scaletrain.validate.match import FORMAT, MeasuredRun

PREDICTION_FILE = PREDICTION
GIVE_PREDICTION = "give the prediction.json that `scaletrain predict` wrote, or its --out directory"
USABLE = ("completed", "stopped")
"""Statuses whose summary.json holds a run's steady-state means (a stopped run trained whole epochs)."""

PREDICTED_POINT = schema.Record({
    "id": schema.STR, "config": schema.OBJECT, "step_time_s": schema.NUM,
    "phases_s": schema.Opt(schema.MapOf(schema.NUM)), "samples_per_s": schema.Opt(schema.NUM),
    "peak_memory_bytes": schema.Opt(schema.NUM), "memory_kind": schema.Opt(schema.STR),
}, required=("id", "config", "step_time_s"))
PREDICTION = schema.Record({"basis": schema.Opt(schema.STR), "basis_note": schema.Opt(schema.STR),
                            "points": schema.ListOf(PREDICTED_POINT)}, required=("points",))


def prediction_path(path: str | Path) -> Path:
    """PATH itself, or PATH/prediction.json for a directory; a UserError when there is none."""
    p = Path(path)
    if p.is_dir():
        if not (p / PREDICTION_FILE).is_file():
            raise UserError(f"{p} holds no {PREDICTION_FILE}: {GIVE_PREDICTION}")
        return p / PREDICTION_FILE
    if not p.exists():
        raise UserError(f"{p} does not exist: {GIVE_PREDICTION}")
    return p


def load_prediction(path: str | Path) -> dict[str, Any]:
    """A prediction (format 1) from a file or the directory holding it; anything else is one UserError line."""
    p = prediction_path(path)
    try:
        data = json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        why = f"{e.msg}, line {e.lineno}" if isinstance(e, json.JSONDecodeError) else "not text"
        raise UserError(f"{p} is not a prediction: not valid JSON ({why}); {GIVE_PREDICTION}") from None
    if not isinstance(data, dict) or data.get("kind") != "prediction":
        what = f'kind {json.dumps(data.get("kind"))}' if isinstance(data, dict) else schema.json_type(data)
        raise UserError(f'{p} is not a prediction ({what}, expected kind "prediction"): {GIVE_PREDICTION}')
    if data.get("format") != FORMAT:
        raise UserError(f"{p} is a prediction of format {json.dumps(data.get('format'))}; this scaletrain reads "
                        f"format {FORMAT}: rerun `scaletrain predict` with this version")
    schema.check(data, PREDICTION, str(p), "rerun `scaletrain predict` to rewrite it")
    return data


def _resolved(config: dict[str, Any]) -> dict[str, Any]:
    """config.toml leaves image_size out when the dataset's default was used: fill that in, as a prediction does."""
    if config.get("image_size") is None and isinstance(config.get("dataset"), str):
        from scaletrain.data import default_image_size  # imports torch: only for runs that need it

        return {**config, "image_size": default_image_size(config["dataset"])}
    return config


def read_run(run_dir: Path, label: str, point: str | None = None, point_config: dict[str, Any] | None = None,
             notes: list[str] | None = None) -> MeasuredRun | None:
    """A run's measurements, or None (with a note saying why) when it has none to compare yet."""
    def skip(why: str) -> None:
        if notes is not None:
            notes.append(f"{label}: {why}: skipped")

    if not run_dir.is_dir():
        return skip("not run yet (no run directory)")
    summary = read_summary(run_dir)
    if summary is None:
        return skip("no summary.json (still running, or killed before the end)")
    status = summary.get("status")
    if status not in USABLE:
        error = f": {summary['error']}" if summary.get("error") else ""
        return skip(f"{status}{error}")
    if summary.get("step_time_mean_s") is None:
        return skip("summary.json has no step_time_mean_s (trained with --profile off, or too few steps)")
    saved = RunDir(run_dir).config
    if saved.is_file():
        config = read_toml(saved)
        schema.check(config, schema.CONFIG, str(saved), "fix that value, or rerun the run")
    elif point_config is not None:
        config = point_config
    else:
        return skip("no config.toml, so its configuration is unknown")
    return MeasuredRun(run_dir=label, config=_resolved(config), step_time_s=summary["step_time_mean_s"],
                       phases_s=summary.get("phases_mean_s"), samples_per_s=summary.get("samples_per_s"),
                       peak_memory_bytes=summary.get("peak_memory_bytes"), memory_kind=summary.get("memory_kind"),
                       point=point)


def load_measured(paths: list[Path], notes: list[str] | None = None) -> list[MeasuredRun]:
    """Every usable run among the run and study directories given (a study: each repeat of each point).

    Runs that cannot be compared (still running, failed, unprofiled) are left out with a line in `notes`;
    when none is left, or a path is neither a run nor a study, it is a UserError."""
    found: list[MeasuredRun] = []
    skipped: list[str] = []
    seen: set[Path] = set()
    for path in map(Path, paths):
        if kind_of(path) == "study":
            study = load_study(path)
            todo = [(study.root / r, str(path / r), p["id"], p.get("config"))
                    for p in study.points for r in p.get("runs") or []]
            if not todo:
                skipped.append(f"{path}: the study has no runs yet")
        else:
            todo = [(path, str(path), None, None)]
        for run_dir, label, point, config in todo:
            if run_dir.resolve() in seen:
                continue
            seen.add(run_dir.resolve())
            run = read_run(run_dir, label, point, config, skipped)
            if run is not None:
                found.append(run)
    if notes is not None:
        notes += skipped
    if not found:
        first = f" ({skipped[0]}{'; ...' if len(skipped) > 1 else ''})" if skipped else ""
        raise UserError(f"no usable run to validate against{first}: give completed runs or a study with completed "
                        "points")
    return found


__all__ = ["PREDICTION_FILE", "prediction_path", "load_prediction", "read_run", "load_measured"]
