"""The configuration's sections in order, and each setting's key, section and field: what the flags, config.toml,
the study's axes and every check of a flat setting are made from (no TrainConfig here: it imports this)."""

from __future__ import annotations

from dataclasses import Field

from scaletrain.comm.pipeline.options import PipelineOptions
from scaletrain.comm.ps.options import PsOptions
from scaletrain.comm.spatial.options import SpatialOptions
from scaletrain.config.fields import setting_key, settings
from scaletrain.config.sections import (DataConfig, FaultsConfig, LaunchConfig, ModelConfig, OptimConfig, ProfileConfig,
                                        StrategyConfig)

SECTIONS: dict[str, type] = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "launch": LaunchConfig,
                             "strategy": StrategyConfig, "ps": PsOptions, "pipeline": PipelineOptions,
                             "spatial": SpatialOptions,
                             "profile": ProfileConfig, "faults": FaultsConfig}
"""Section name (TrainConfig's attribute) -> its class, in order: the groups of `scaletrain train --help`. A
strategy's own section lives beside the strategy (comm/registry.py OPTION_SECTIONS names it)."""

KEYS: dict[str, tuple[str, str]] = {setting_key(f): (name, f.name) for name, section in SECTIONS.items()
                                    for f in settings(section)}
"""Setting key -> (section, attribute): `"strategy"` -> ("strategy", "name")."""


def config_fields() -> list[Field]:
    """Every section's settings, in section order: the flags of `scaletrain train` (their keys: setting_key)."""
    return [f for section in SECTIONS.values() for f in settings(section)]
