"""What every section of the configuration shares: a setting's key (its flag, its config.toml key and its
name in a run's files) and the one-line checks of a value."""

from __future__ import annotations

import functools
from dataclasses import Field, fields
from typing import Any

from scaletrain.errors import UserError


def key(name: str) -> dict[str, str]:
    """Field metadata naming the setting where its attribute is named otherwise (`cfg.model.name` is `--model`)."""
    return {"key": name}


def setting_key(f: Field) -> str:
    """The setting's key: `batch_size` (flag `--batch-size`, `batch_size = 64` in config.toml)."""
    return f.metadata.get("key", f.name)


def settings(section) -> tuple[Field, ...]:
    """A section's settings (its init fields), in their order."""
    return _settings(section if isinstance(section, type) else type(section))


@functools.cache
def _settings(cls: type) -> tuple[Field, ...]:  # (read per configuration made: a plan makes thousands)
    return tuple(f for f in fields(cls) if f.init)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"{flag(name)} must be one of {', '.join(choices)} (got {value!r})")


def at_least(section: Any, least: int, *attrs: str) -> None:
    """Each of the section's `attrs` is `least` or more, else one line naming its flag."""
    keys = {f.name: setting_key(f) for f in fields(section)}
    for attr in attrs:
        value = getattr(section, attr)
        if value < least:
            what = "at least 1" if least == 1 else f"{least} or more"
            raise UserError(f"{flag(keys[attr])} must be {what} (got {value})")
