"""Reading and writing configurations: TOML files, flag overrides, and the resolved config.toml of a run."""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from scaletrain.comm.pipeline.options import expand_nproc
from scaletrain.config import applies
from scaletrain.config.fields import setting_key
from scaletrain.config.schema import KEYS, SECTIONS, config_fields
from scaletrain.config.train import TrainConfig
from scaletrain.errors import UserError
from scaletrain.rundir import RunDir, default_out

# names other tools use for our keys: only for suggestions, never accepted silently
ALIASES = {"learning_rate": "lr", "num_workers": "workers", "wd": "weight_decay", "batch": "batch_size",
           "world_size": "nproc", "nproc_per_node": "nproc", "output_dir": "out", "amp": "precision"}


def field_names() -> list[str]:
    return list(KEYS)


def read_toml(path: str | Path, what: str = "config file", fix: str = "fix that line") -> dict[str, Any]:
    """A TOML file as a dict; a missing or malformed file is one clear line (`what` names the file, `fix` the
    remedy for a malformed one)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist: check the --config path")
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{what} {path}".strip() + f" is not valid TOML ({e}): {fix}") from None


def train_table(raw: dict[str, Any]) -> dict[str, Any]:
    """A configuration's settings: the file itself, or its [train] table when it holds only that (as
    `scaletrain train --config` and a run's readers accept)."""
    return raw["train"] if set(raw) == {"train"} and isinstance(raw["train"], dict) else raw


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config into {field: value}, naming any unknown or misspelt key."""
    path = Path(path)
    raw = read_toml(path)
    if set(raw) == {"train"} and not isinstance(raw["train"], dict):
        raise UserError(f"'train' in {path} must be a [train] table of settings: write them as key = value")
    return {setting_name(key, str(path)): value for key, value in train_table(raw).items()}


def setting_name(key: str, where: str) -> str:
    """A setting's key (`batch-size` or `batch_size`: a TOML key, a keyword of scaletrain.api) as its field
    name; an unknown or misspelt key is a UserError naming `where` it was given and the key meant."""
    name = key.replace("-", "_")
    known = field_names()
    if name not in known:
        close = difflib.get_close_matches(name, known + list(ALIASES), n=1)
        hint = f"did you mean '{ALIASES.get(close[0], close[0])}'?" if close else f"known keys: {', '.join(known)}"
        raise UserError(f"unknown key '{key}' in {where}: {hint}")
    return name


def build_config(file_values: dict[str, Any], overrides: dict[str, Any]) -> TrainConfig:
    """Defaults < TOML file < command-line overrides; types are checked against the defaults."""
    types = _types()
    # every value is checked, also a file's value that a flag overrides: a wrong file stays wrong
    file_values = {k: _coerce(k, v, types[k]) for k, v in file_values.items() if k in types}
    overrides = {k: _coerce(k, v, types[k]) for k, v in overrides.items() if k in types}
    return TrainConfig.from_dict({**file_values, **overrides})


def _types() -> dict[str, str]:
    return {setting_key(f): str(f.type) for f in config_fields()}


def setting_kind(name: str) -> str:
    """A setting's base type name: "int" for `int | None`, "float" for `float | str | None`."""
    return _types()[name].split("|")[0].strip()


def has_kind(name: str, value: Any) -> bool:
    """Whether `value` is of the setting's base type (an int for a float setting too)."""
    kind = setting_kind(name)
    if kind == "bool":
        return isinstance(value, bool)
    want = {"int": int, "float": (int, float), "str": str}[kind]
    if isinstance(value, str) and _takes_words(name):  # a number or a word (`--bucket-cap-mb auto`): the field checks
        return True
    return isinstance(value, want) and not isinstance(value, bool)


def _takes_words(name: str) -> bool:
    return "str" in (p.strip() for p in _types()[name].split("|"))


def from_text(name: str, text: str) -> Any:
    """A value written as text (a study's comma list) as the setting's type; ValueError if it is not one."""
    kind = setting_kind(name)
    if kind == "bool":
        if text.lower() not in ("true", "false"):
            raise ValueError(text)
        return text.lower() == "true"
    try:
        return {"int": int, "float": float}.get(kind, str)(text)
    except ValueError:
        if _takes_words(name):  # a word the field checks (`--bucket-cap-mb 0.25,auto`)
            return text
        raise


def check_setting(name: str, value: Any) -> None:
    """One setting's value on its own: its type and its section's checks, not those relating it to other
    settings (what it needs to apply, ...): a study checks each axis value so, and each point whole."""
    section, attr = KEYS[name]
    SECTIONS[section](**{attr: _coerce(name, value, _types()[name])})


_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def _coerce(name: str, value: Any, annotation: str) -> Any:
    """Check a value against its field's annotation ("int", "str | None", ...); ints widen to float."""
    parts = [p.strip() for p in annotation.split("|")]
    if value is None and "None" in parts:
        return value
    want = _TYPES[parts[0]]
    if "str" in parts and isinstance(value, str):  # a number or a word (`--bucket-cap-mb auto`): the field checks
        return value
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, want) or (want is not bool and isinstance(value, bool)):
        raise UserError(f"'{name}' must be a {want.__name__}, got {value!r}: fix that value")
    return value


# settings of one invocation, not of the run: never saved in config.toml, never inherited on --resume
INVOCATION_ONLY = ("resume", "stop_after")


def save_toml(config: TrainConfig, path: Path) -> None:
    """Write the run's resolved settings (None values omitted, as TOML has no null; nor the invocation's
    own, INVOCATION_ONLY), so that `--config this-file --out NEW` reruns the run."""
    data = {k: v for k, v in config.to_dict().items() if v is not None and k not in INVOCATION_ONLY}
    path.write_text("# resolved scaletrain configuration; rerun with --config this-file\n" + tomli_w.dumps(data))


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """A configuration from its flat settings (a run's config.toml or summary.json `config`): others are left out."""
    return TrainConfig.from_dict(data)

def resolve_train_config(overrides: dict[str, Any], config_file: str | None,
                         planned: dict[str, Any] | None = None) -> TrainConfig:
    """What `scaletrain train` runs: defaults < the run's saved config.toml (on --resume) < the --config
    file < `planned` (a plan's chosen settings, --plan) < `overrides` (the flags given); `--nproc KxR` as K
    stages x R replicas; the default --out."""
    kxr = overrides.get("nproc") if isinstance(overrides.get("nproc"), str) else None
    overrides = expand_nproc(dict(overrides))
    file_values = load_toml(config_file) if config_file else {}
    if planned:
        if "dataset" in overrides and overrides["dataset"] != "synthetic":
            planned = {k: v for k, v in planned.items() if k != "synthetic_samples"}
        file_values = {**file_values, **planned}
    if overrides.get("resume"):
        out = overrides.get("out") or file_values.get("out")
        if not out:
            raise UserError("--resume needs --out DIR: the run directory to continue")
        saved = RunDir(Path(out)).config
        base = load_toml(saved) if saved.is_file() else {}
        for key in INVOCATION_ONLY:  # an older run's config.toml may hold them; they are never inherited
            base.pop(key, None)
        file_values = {**base, **file_values}
    if kxr and "stages" in applies.unmet({**file_values, **overrides}):
        raise UserError(f"--nproc {kxr} (stages x replicas) applies only with {applies.NEEDS['stages'].what}: add "
                        f"it, or give --nproc {overrides['nproc']}")
    cfg = build_config(file_values, overrides)
    if cfg.launch.out is None:
        cfg.launch.out = default_out(cfg.model.name, cfg.data.dataset)
    return cfg
