"""`TrainConfig`: the sections, nested (`cfg.optim.lr`, `cfg.launch.nproc`, `cfg.ps.servers`), each validated
on its own, then what spans them (the strategy's own checks, settings set to no effect); the job's `layout`.

Outside, a configuration is flat, one key per setting: the flags, config.toml and a run's files
(`to_dict`, `from_dict`, `replace`)."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from scaletrain.comm import registry
from scaletrain.comm.pipeline.options import PipelineOptions
from scaletrain.comm.ps.options import PsOptions
from scaletrain.comm.spatial.options import SpatialOptions
from scaletrain.config import applies
from scaletrain.config.fields import setting_key, settings
from scaletrain.config.layout import Layout
from scaletrain.config.schema import KEYS, SECTIONS
from scaletrain.config.sections import (DataConfig, FaultsConfig, LaunchConfig, ModelConfig, OptimConfig, ProfileConfig,
                                        StrategyConfig)
from scaletrain.errors import UserError


@dataclass(kw_only=True)
class TrainConfig:
    """Everything a training run needs; saved resolved, flat, as `config.toml` in the run directory."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    ps: PsOptions = field(default_factory=PsOptions)
    pipeline: PipelineOptions = field(default_factory=PipelineOptions)
    spatial: SpatialOptions = field(default_factory=SpatialOptions)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)

    def __post_init__(self) -> None:
        applies.check(self.to_dict())  # a setting set to no effect
        options = self.strategy_options
        if options is not None:
            options.check(self)

    @property
    def strategy_options(self) -> Any:
        """The chosen strategy's own settings section (`cfg.ps`, `cfg.pipeline`), or None."""
        section = registry.OPTION_SECTIONS.get(self.strategy.name)
        return getattr(self, section) if section else None

    @property
    def layout(self) -> Layout:
        """How the job's ranks divide (config/layout.py), from the launch and the strategy's options."""
        layout = Layout(nodes=self.launch.nnodes, per_node=self.launch.nproc)
        options = self.strategy_options
        return options.shape(layout, self) if options is not None else layout

    def check_launch(self) -> None:
        """What depends on the launch's shape (nproc x nnodes), checked when launching, not per study axis."""
        layout = self.layout
        inject = self.faults.injection
        for what, rank in (("slow-rank", inject.slow_rank), ("kill-rank", inject.kill_rank),
                           ("stop-rank", inject.stop_rank)):
            if rank is not None and rank >= layout.world:
                raise UserError(f"--inject {what}={rank}:...: there are only {layout.world} ranks "
                                f"(0..{layout.world - 1}): name one of them")
        options = self.strategy_options
        if options is not None:
            options.check_layout(self, layout)

    # ------------------------------------------------------------ the flat form: flags, config.toml, run files
    def to_dict(self) -> dict[str, Any]:
        """{key: value} for every setting, in section order (what config.toml and a run's files hold)."""
        return {setting_key(f): getattr(section, f.name) for section in self.sections() for f in settings(section)}

    @classmethod
    def from_dict(cls, flat: dict[str, Any]) -> TrainConfig:
        """From {key: value} (keys not given take their defaults; unknown keys are left out)."""
        return cls(**{name: section(**{f.name: flat[key] for f in settings(section) if (key := setting_key(f)) in flat})
                      for name, section in SECTIONS.items()})

    def replace(self, **flat: Any) -> TrainConfig:
        """A copy with some settings changed, by key (`cfg.replace(batch_size=32)`), checked anew."""
        unknown = set(flat) - set(KEYS)
        if unknown:
            raise TypeError(f"TrainConfig has no setting {', '.join(sorted(unknown))}")
        sections = {}
        for name, section in SECTIONS.items():  # a section whose settings change is made (and checked) anew
            mine = {f.name: flat[k] for f in settings(section) if (k := setting_key(f)) in flat}
            held = getattr(self, name)
            sections[name] = dataclasses.replace(held, **mine) if mine else copy.copy(held)
        return TrainConfig(**sections)  # (then what spans the sections, as from_dict's)

    def sections(self) -> list[Any]:
        return [getattr(self, name) for name in SECTIONS]


def layout_of(flat: dict[str, Any]) -> Layout | None:
    """The layout of a run's saved settings (its config.toml, summary.json's `config`), or None where they do
    not make a configuration (a damaged or hand-edited file: its readers name what is wrong)."""
    try:
        return TrainConfig.from_dict(flat).layout
    except (UserError, TypeError, ValueError):
        return None

