"""The training configuration: typed sections (sections.py; a strategy's own beside it, comm/*/options.py) nested
in `TrainConfig` (train.py), the job's layout (layout.py), its sub-specs (specs.py), the settings that apply only
with another (applies.py), files and overrides (io.py), and the flags made from it (flags.py)."""

from scaletrain.config.io import (ALIASES, INVOCATION_ONLY, build_config, check_setting, config_from_dict, field_names,
                                  load_toml, read_toml, resolve_train_config, save_toml)
from scaletrain.config.layout import Layout
from scaletrain.config.sections import OPTIMIZERS, PRECISIONS, SCHEDULES
from scaletrain.config.specs import Injection, parse_inject, torch_profile_window
from scaletrain.config.schema import KEYS, SECTIONS, config_fields
from scaletrain.config.train import TrainConfig, layout_of

__all__ = ["ALIASES", "INVOCATION_ONLY", "KEYS", "OPTIMIZERS", "PRECISIONS", "SCHEDULES", "SECTIONS", "Injection",
           "Layout", "TrainConfig", "build_config", "check_setting", "config_fields", "config_from_dict", "field_names",
           "layout_of", "load_toml", "parse_inject", "read_toml", "save_toml", "torch_profile_window"]
