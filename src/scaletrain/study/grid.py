"""A study's spec (axes, fixed train settings, repeats), read from flags or study.toml, and the points it spans."""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tomli_w

from scaletrain.config import TrainConfig, applies, build_config, check_setting, field_names, read_toml
from scaletrain.config.io import from_text, has_kind, setting_kind, setting_name
from scaletrain.errors import UserError

AXES = ("nproc", "workers", "batch_size", "precision", "dataset", "model", "strategy", "compress", "bucket_cap_mb",
        "ps_servers", "stages", "microbatches", "pipeline_schedule", "split", "spatial", "checkpoint_activations")
"""TrainConfig fields a study can vary; a new axis (e.g. `strategy`) is just its field name added here."""
STUDY_OWNED = ("out", "resume", "progress", "stop_after")
"""Train settings the study sets itself per run, so they are not fixed settings of the spec."""
PER_RUN = ("out", "resume", "progress")
"""Launch mechanics the runner sets for each run; left out of a point's recorded settings."""
VALIDATION_BLIND = ("workers", "compress")
"""Settings launch.validate does not read: points that differ only in these are validated once."""
KIND_WORDS = {"int": "integers", "float": "numbers", "str": "strings", "bool": "true or false"}


@dataclass
class StudySpec:
    """What a study runs: every combination of the axis values, each with the fixed train settings, `repeats` times."""

    axes: dict[str, list[Any]]
    train: dict[str, Any] = field(default_factory=dict)
    repeats: int = 1


@dataclass(frozen=True)
class Point:
    """One combination of axis values and the validated TrainConfig that runs it."""

    id: str
    axes: dict[str, Any]
    config: TrainConfig
    dropped: tuple[str, ...] = ()  # axis values set to no effect here (config/applies.py): the point repeats another
    refused: str | None = None  # with points(keep_refused=True): why its options do not combine (config is None)

    def settings(self) -> dict[str, Any]:
        """The point's full train settings, without the per-run ones (out, resume, progress)."""
        return {k: v for k, v in self.config.to_dict().items() if k not in PER_RUN}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _convert(name: str, text: str, item: str) -> Any:
    try:
        return from_text(name, item)
    except ValueError:
        kind = setting_kind(name)
        if kind == "bool":
            raise UserError(f"{_flag(name)} {text}: '{item}' is not true or false") from None
        word = "an integer" if kind == "int" else "a number"
        raise UserError(f"{_flag(name)} {text}: '{item}' is not {word}; give a comma list such as "
                        f"{_flag(name)} 1,2,4") from None


def _example(name: str) -> str:
    value = applies.defaults()[name]
    return f"{name} = [{json.dumps(value) if value is not None else '...'}]"


def check_axis_values(name: str, values: list[Any], where: str) -> None:
    """Each value must be of the field's type, valid on its own (TrainConfig's checks) and listed once."""
    if not values:
        raise UserError(f"{where}: {name} has no values; give at least one")
    kind = setting_kind(name)
    wrong = next((v for v in values if not has_kind(name, v)), None)
    if wrong is not None:
        what = {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list",
                dict: "a table"}.get(type(wrong), type(wrong).__name__)
        raise UserError(f"{where}: {name} takes {KIND_WORDS[kind]}, got {json.dumps(wrong, default=str)} ({what}): "
                        f"write e.g. {_example(name)} (study axes: {', '.join(AXES)})")
    for value in values:
        try:
            check_setting(name, value)
        except UserError as e:
            raise UserError(f"{where}: {e}") from None
    seen = [v for i, v in enumerate(values) if v in values[:i]]
    if seen:
        raise UserError(f"{where}: {name} lists {seen[0]!r} twice; give each value once")


def given_settings(given: dict[str, Any], axes: tuple[str, ...]) -> dict[str, Any]:
    """The settings a study's (or a prediction's) flags gave for every point: those neither axes nor the study's own."""
    return {k: given[k] for k in field_names() if k in given and k not in axes and k not in STUDY_OWNED}


def parse_axis(name: str, text: str) -> list[Any]:
    """A comma list from the command line (`--workers 0,2`), each element typed and validated."""
    items = [t.strip() for t in text.split(",")]
    if any(not t for t in items):
        raise UserError(f"{_flag(name)} {text!r} has an empty value; give a comma list such as {_flag(name)} 1,2")
    values = [_convert(name, text, t) for t in items]
    check_axis_values(name, values, f"{_flag(name)} {text}")
    return values


def _train_key(key: str, path: Path) -> str:
    """A [train] key as a setting's key, naming a misspelt one (config/io.py's setting_name, as config.toml's)."""
    name = setting_name(key, f"[train] of {path}")
    if name in STUDY_OWNED:
        raise UserError(f"'{key}' in [train] of {path} is set by the study for each run: remove it "
                        "(the study directory is --out)")
    return name


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """Read a study TOML into {"axes": {...}, "train": {...}, "repeats": int | None}, naming any bad key."""
    path = Path(path)
    raw = read_toml(path, "study file")
    unknown = [k for k in raw if k not in ("axes", "train", "repeats")]
    if unknown:
        raise UserError(f"unknown key '{unknown[0]}' in {path}: a study file has [axes], [train] and repeats "
                        "(train settings go under [train])")
    for table in ("axes", "train"):
        if not isinstance(raw.get(table, {}), dict):
            known = f" (study axes: {', '.join(AXES)})" if table == "axes" else ""
            raise UserError(f"'{table}' in {path} must be a [{table}] table of key = value lines{known}")
    axes: dict[str, list[Any]] = {}
    for key, value in raw.get("axes", {}).items():
        name = key.replace("-", "_")
        if name not in AXES:
            close = difflib.get_close_matches(name, AXES, n=1)
            hint = ("put a fixed value under [train]" if name in field_names()
                    else f"did you mean '{close[0]}'?" if close else "vary one of those, or drop it")
            raise UserError(f"'{key}' in [axes] of {path} is not a study axis (axes: {', '.join(AXES)}): {hint}")
        axes[name] = value if isinstance(value, list) else [value]
        check_axis_values(name, axes[name], f"[axes] of {path}")
    train: dict[str, Any] = {}
    for key, value in raw.get("train", {}).items():
        name = _train_key(key, path)
        if name in AXES:  # a fixed value of an axis is a one-value axis
            if name in axes:
                raise UserError(f"'{key}' is both in [axes] and [train] of {path}: keep one")
            axes[name] = [value]
            check_axis_values(name, axes[name], f"[train] of {path}")
        else:
            train[name] = value
    repeats = raw.get("repeats")
    if repeats is not None and (not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1):
        raise UserError(f"repeats in {path} must be a whole number of at least 1 (got {repeats!r})")
    return {"axes": axes, "train": train, "repeats": repeats}


def resolve_spec(file_spec: dict[str, Any] | None, axes: dict[str, list[Any]], train: dict[str, Any],
                 repeats: int | None) -> StudySpec:
    """The file's axes, settings and repeats, each overridden by the flags given; nproc is always an axis."""
    file_spec = file_spec or {"axes": {}, "train": {}, "repeats": None}
    merged_axes = {**file_spec["axes"], **axes}
    merged_train = {**file_spec["train"], **train}
    if "nproc" not in merged_axes:  # the scaling axis: shown, and in every point id, even when fixed
        merged_axes["nproc"] = [applies.defaults()["nproc"]]
    repeats = repeats if repeats is not None else file_spec["repeats"] or 1
    if repeats < 1:
        raise UserError(f"--repeats must be at least 1 (got {repeats})")
    return StudySpec(axes={a: merged_axes[a] for a in AXES if a in merged_axes}, train=merged_train,
                     repeats=repeats)


@dataclass(frozen=True)
class Threads:
    """The intra-op threads per rank every point of a study runs, and where the number comes from.

    source: `given` (--threads or [train]), `recorded` (a resumed study's study.toml), `cores` (cores / the
    grid's largest processes per node) or `node` (None here: each SLURM job works it out on its node)."""

    threads: int | None
    source: str
    cores: int | None
    processes: int
    """The grid's largest processes per node (its largest nproc)."""


def fair_threads(spec: StudySpec, cores: int | None, recorded: StudySpec | None = None) -> tuple[StudySpec, Threads]:
    """The spec with one --threads for every point, unless the user set it: left alone, the trainer gives a CPU
    rank cores / its own point's processes, so a 1-process baseline gets more threads per rank than the
    points it is compared with, and their speedup is not the processes' alone (docs/study.md).

    `recorded`: the spec of the study being resumed, whose threads (or none, for a study begun before) stay;
    `cores` None: the cores are known only where the runs start (SLURM), which applies the same rule there."""
    largest = max(int(n) for n in spec.axes.get("nproc", [applies.defaults()["nproc"]]))
    if spec.train.get("threads") is not None:
        return spec, Threads(spec.train["threads"], "given", cores, largest)
    if recorded is not None and recorded.train.get("threads") is not None:
        threads = recorded.train["threads"]
        return replace(spec, train={**spec.train, "threads": threads}), Threads(threads, "recorded", cores, largest)
    if cores is None:
        return spec, Threads(None, "node", None, largest)
    if recorded is not None:  # a study begun before studies fixed the threads: its points go on as they began
        return spec, Threads(None, "recorded", cores, largest)
    threads = max(1, cores // largest)
    return replace(spec, train={**spec.train, "threads": threads}), Threads(threads, "cores", cores, largest)


def _safe(text: str) -> str:
    """A file-name-safe form of a value; a hash keeps two values apart once characters were replaced."""
    safe = re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")
    if safe != text or len(safe) > 40:
        safe = f"{safe[:40]}_{hashlib.sha1(text.encode()).hexdigest()[:6]}"
    return safe


def point_id(values: dict[str, Any], varying: list[str]) -> str:
    """`nproc2-workers1-model_lenet5`: nproc always, then every axis with more than one value."""
    parts = []
    for name in ["nproc", *[n for n in varying if n != "nproc"]]:
        value = values[name]
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        parts.append(f"{name}{value}" if numeric and _safe(str(value)) == str(value)
                     else f"{name}_{_safe(str(value))}")
    return "-".join(parts)


def points(spec: StudySpec, keep_refused: bool = False) -> list[Point]:
    """Every combination in grid order (nproc varies fastest, so a scaling series is contiguous), validated.

    A setting that applies only with another (config/applies.py: `--stages` with `--strategy pipeline`) is
    left out of the points that lack it, and refused when no point has it. A combination whose options do not
    combine is refused in one line (a study runs what it was asked to), or, with `keep_refused` (predict and
    plan price what combines), kept as a point with its reason and no config."""
    names = list(spec.axes)
    varying = [n for n in names if len(spec.axes[n]) > 1]
    result = []
    unused: set[str] | None = None  # set, and left out of every point so far
    for combo in itertools.product(*(spec.axes[n] for n in reversed(names))):
        values = dict(zip(reversed(names), combo, strict=True))
        values = {n: values[n] for n in names}
        pid = point_id(values, varying)
        dropped = set(applies.unmet({**spec.train, **values}))
        unused = dropped if unused is None else unused & dropped
        try:
            cfg = build_config({k: v for k, v in spec.train.items() if k not in dropped},
                               {k: v for k, v in values.items() if k not in dropped})
        except UserError as e:
            if not keep_refused:
                raise UserError(f"{point_name(pid, values)}: {e}") from None
            result.append(Point(id=pid, axes=values, config=None, refused=str(e)))  # type: ignore[arg-type]
            continue
        result.append(Point(id=pid, axes=values, config=cfg, dropped=tuple(n for n in names if n in dropped)))
    if unused:
        name = next(n for n in applies.NEEDS if n in unused)
        raise UserError(applies.message(name, {**spec.train, **result[0].axes}, study=True))
    return result


def point_name(pid: str, values: dict[str, Any]) -> str:
    """`study point nproc2-model_x (nproc=2, model=x)`, as errors name a point."""
    return f"study point {pid} ({', '.join(f'{k}={v}' for k, v in values.items())})"


def validate_points(grid: list[Point], validate: Callable[[TrainConfig], None]) -> int:
    """`validate` (launch.validate: model, data, batch, launch shape) on every point before any is launched.

    It builds the model and the data, so points that differ only in VALIDATION_BLIND settings are checked
    once. The first failure is a UserError naming the point; returns how many checks ran."""
    seen: set[str] = set()
    for p in grid:
        key = json.dumps({k: v for k, v in p.settings().items() if k not in VALIDATION_BLIND}, sort_keys=True,
                         default=str)
        if key in seen:
            continue
        seen.add(key)
        try:
            validate(p.config)
        except UserError as e:
            raise UserError(f"{point_name(p.id, p.axes)}: {e}") from None
    return len(seen)


def spec_difference(old: StudySpec, new: StudySpec) -> str | None:
    """None when both run the same points with the same settings (repeats may differ), else the first difference."""
    for name in dict.fromkeys([*old.axes, *new.axes]):
        if old.axes.get(name) != new.axes.get(name):
            return f"{name}: {old.axes.get(name, 'not an axis')} there, {new.axes.get(name, 'not an axis')} here"
    for a, b in zip(points(old), points(new), strict=True):
        sa, sb = a.settings(), b.settings()
        for key in sa:
            if sa[key] != sb[key]:
                return f"{key}: {sa[key]!r} there, {sb[key]!r} here"
    return None


def spec_toml(spec: StudySpec) -> str:
    """The resolved spec as TOML; `scaletrain study --config study.toml --out DIR` reruns or resumes it."""
    def value(v: Any) -> str:
        return tomli_w.dumps({"v": v})[len("v = "):].strip()

    # one line per axis ("nproc = [1, 2, 4]"): tomli_w would spread every list over several lines
    axes = "".join(f"{k} = [{', '.join(value(v) for v in vs)}]\n" for k, vs in spec.axes.items())
    return ("# scaletrain study spec; resume with: scaletrain study --config study.toml --out <this folder>\n"
            f"repeats = {spec.repeats}\n\n[axes]\n{axes}\n" + tomli_w.dumps({"train": spec.train}))


__all__ = ["AXES", "STUDY_OWNED", "PER_RUN", "StudySpec", "Point", "Threads", "fair_threads", "parse_axis",
           "load_spec_file", "resolve_spec",
           "points", "point_id", "point_name", "validate_points", "spec_difference", "spec_toml", "check_axis_values"]
