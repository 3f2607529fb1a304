"""`TrainConfig`: every section's fields side by side (the flat flags and config.toml keys), validated
once, each section handed to the component it configures (`cfg.optim` to the optimizer, ...)."""

from __future__ import annotations

import dataclasses
from dataclasses import Field, dataclass, fields
from typing import Any

from scaletrain.config import applies
from scaletrain.config.sections import (SECTIONS, DataConfig, FaultsConfig, LaunchConfig, ModelConfig, OptimConfig,
                                        ProfileConfig, StrategyConfig)
from scaletrain.config.specs import Injection
from scaletrain.errors import UserError


def config_fields() -> list[Field]:
    """Every section's settings (init fields), in section order: the flags of `scaletrain train`."""
    return [f for section in SECTIONS.values() for f in fields(section) if f.init]


def _section_names() -> dict[str, str]:
    return {f.name: key for key, section in SECTIONS.items() for f in fields(section) if f.init}


class _Sections:
    """The section views and the checks that span sections; mixed into the flat TrainConfig."""

    @property
    def data(self) -> DataConfig:
        return self._section("data")

    @property
    def model_section(self) -> ModelConfig:  # (`model` is the model's name, a flat key)
        return self._section("model")

    @property
    def optim(self) -> OptimConfig:
        return self._section("optim")

    @property
    def launch(self) -> LaunchConfig:
        return self._section("launch")

    @property
    def strategy_section(self) -> StrategyConfig:  # (`strategy` is its name, a flat key)
        return self._section("strategy")

    @property
    def profile_section(self) -> ProfileConfig:  # (`profile` is the on/off switch, a flat key)
        return self._section("profile")

    @property
    def faults(self) -> FaultsConfig:
        return self._section("faults")

    # parsed sub-specs, from their sections
    @property
    def injection(self) -> Injection:
        return self.faults.injection

    @property
    def torch_profile_steps(self) -> tuple[int, int] | None:
        return self.profile_section.torch_profile_steps

    @property
    def compression(self) -> tuple[str, float | int | None] | None:
        return self.strategy_section.compression

    def _section(self, key: str):
        section = SECTIONS[key]
        return section(**{f.name: getattr(self, f.name) for f in fields(section) if f.init})

    def __post_init__(self) -> None:
        for key in SECTIONS:  # each section validates its own fields
            self._section(key)
        self._check_across()

    def _check_across(self) -> None:
        """What one section cannot check alone."""
        applies.check({f.name: getattr(self, f.name) for f in config_fields()})  # a setting set to no effect
        if self.strategy.startswith("ps-"):
            if self.precision == "fp16":
                raise UserError(f"--precision fp16 is not supported with --strategy {self.strategy} (the "
                                "servers apply unscaled gradients): use --precision bf16 or fp32")
            if self.sync_bn:
                raise UserError(f"--sync-bn is not supported with --strategy {self.strategy}: drop --sync-bn")
        if self.strategy == "pipeline":
            if self.precision == "fp16":
                raise UserError("--precision fp16 is not supported with --strategy pipeline (the schedule runs "
                                "backward itself, without the loss scaler): use --precision bf16 or fp32")
            if self.sync_bn:
                raise UserError("--sync-bn is not supported with --strategy pipeline: drop --sync-bn")
            if self.batch_size % self.microbatches:
                raise UserError(f"--microbatches {self.microbatches} does not divide --batch-size {self.batch_size}: "
                                "choose a batch size that is a multiple of it")

    def check_launch(self) -> None:
        """What depends on the launch's shape (nproc x nnodes), checked when launching, not per study axis."""
        world = self.nproc * self.nnodes
        inject = self.injection
        for what, rank in (("slow-rank", inject.slow_rank), ("kill-rank", inject.kill_rank),
                           ("stop-rank", inject.stop_rank)):
            if rank is not None and rank >= world:
                raise UserError(f"--inject {what}={rank}:...: there are only {world} ranks (0..{world - 1}): "
                                "name one of them")
        if self.strategy == "pipeline":
            stages = self.stages or world
            if world < 2:
                raise UserError(f"--strategy pipeline needs at least 2 processes, one per stage (got --nproc x --nnodes "
                                f"= {world}): give --nproc 2 or more, or --nproc KxR (K stages x R replicas)")
            if world % stages:
                raise UserError(f"--strategy pipeline with --stages {stages} needs a multiple of {stages} processes "
                                f"(got --nproc x --nnodes = {world}): one process per stage and replica")
        from scaletrain.comm.registry import strategy_class

        servers = strategy_class(self.strategy).server_ranks(self)
        if servers and world - servers < 1:
            raise UserError(f"--strategy {self.strategy} with --ps-servers {self.ps_servers} needs more "
                            f"processes than servers (got {world}): raise --nproc to at least {self.ps_servers + 1}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


TrainConfig = dataclass(kw_only=True)(type("TrainConfig", (_Sections,), {
    "__doc__": "Everything a training run needs; saved resolved as `config.toml` in the run directory.\n\n"
               "The fields are the sections' (config/sections.py), flat: `cfg.lr` is `cfg.optim.lr`.",
    "__module__": __name__,
    "__annotations__": {f.name: f.type for f in config_fields()},
    **{f.name: dataclasses.field(default=f.default) if f.default_factory is dataclasses.MISSING
       else dataclasses.field(default_factory=f.default_factory) for f in config_fields()},
}))
