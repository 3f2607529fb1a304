"""Settings that do something only together with another (`--stages` with `--strategy pipeline`, `--ref-batch`
with `--scale-lr`, ...), declared once: a training run refuses one that is set without what it needs (it would
be silently ignored); a study leaves it out of the points that lack it and refuses it when no point has it
(study/grid.py).

The strategy-specific settings come from what each strategy declares (comm/registry.py OPTIONS): this module
names no strategy."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scaletrain.comm.registry import OPTIONS
from scaletrain.config.fields import setting_key
from scaletrain.config.schema import config_fields
from scaletrain.errors import UserError


@dataclass(frozen=True)
class Needs:
    """What a setting needs to have any effect: `what`, as flags; `holds`, whether a configuration's settings
    (every field) have it; `on`, the setting that decides, to say what a configuration has instead."""

    what: str
    holds: Callable[[Mapping[str, Any]], bool]
    on: str


def _strategy_needs() -> dict[str, Needs]:
    needs = {}
    for setting in dict.fromkeys(o for options in OPTIONS.values() for o in options):
        takers = tuple(name for name, options in OPTIONS.items() if setting in options)
        needs[setting] = Needs(f"--strategy {' or '.join(takers)}",
                               lambda s, takers=takers: s["strategy"] in takers, "strategy")
    return needs


def _synthetic(s: Mapping[str, Any]) -> bool:
    return s["dataset"] == "synthetic"


NEEDS: dict[str, Needs] = {
    **_strategy_needs(),
    "synthetic_samples": Needs("--dataset synthetic", _synthetic, "dataset"),
    "synthetic_classes": Needs("--dataset synthetic", _synthetic, "dataset"),
    "bad_images": Needs("--dataset imagefolder:PATH", lambda s: s["dataset"].startswith("imagefolder:"), "dataset"),
    "ref_batch": Needs("--scale-lr", lambda s: s["scale_lr"], "scale_lr"),
    "persistent_workers": Needs("--workers 1 or more", lambda s: s["workers"] > 0, "workers"),
}
"""setting -> what it needs. (--warmup-epochs without --scale-lr is not here: the warm-up is then flat by
design, as it is whenever the scaled LR is not above --lr; see train/optim.py.)"""


@functools.cache
def defaults() -> dict[str, Any]:
    """Every setting's default, by key."""
    return {setting_key(f): f.default for f in config_fields()}


def is_set(name: str, value: Any) -> bool:
    """Whether a setting is set to something other than its default (`none` spells an unset --compress)."""
    return value != defaults()[name] and value not in (None, "", "none")


def unmet(settings: Mapping[str, Any]) -> list[str]:
    """The settings set in `settings` (a configuration's, missing ones at their defaults) whose needs do not hold."""
    full = {**defaults(), **settings}
    return [name for name, needs in NEEDS.items() if name in settings and is_set(name, settings[name])
            and not _holds(needs, full)]


def _holds(needs: Needs, full: Mapping[str, Any]) -> bool:
    try:
        return bool(needs.holds(full))
    except (TypeError, AttributeError):  # a value of the wrong type: its own check names it
        return True


def applicable(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` without those set to no effect (a study point's: `--stages` on an allreduce point)."""
    dropped = set(unmet(settings))
    return {k: v for k, v in settings.items() if k not in dropped}


def message(name: str, settings: Mapping[str, Any], study: bool = False) -> str:
    """`--stages 2 applies only with --strategy pipeline, and this run has --strategy allreduce: ...`."""
    needs, full = NEEDS[name], {**defaults(), **settings}
    has = "which no point of this study has" if study else f"and this run has {spelt(needs.on, full[needs.on])}"
    return f"{spelt(name, full[name])} applies only with {needs.what}, {has}: add {needs.what}, or drop {flag(name)}"


def check(settings: Mapping[str, Any]) -> None:
    """Refuse the first setting set to no effect (TrainConfig's check)."""
    names = unmet(settings)
    if names:
        raise UserError(message(names[0], settings))


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def spelt(name: str, value: Any) -> str:
    """A setting as a user writes it: `--strategy allreduce`, `--scale-lr`, `--no-scale-lr`."""
    if isinstance(value, bool):
        return flag(name) if value else "--no-" + flag(name)[2:]
    return f"{flag(name)} {value}"
