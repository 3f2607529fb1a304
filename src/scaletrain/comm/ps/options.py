"""The parameter servers' settings (`--ps-servers`, `--ps-fetch`, ...), their checks and the layout they make:
no torch, so that a flag is validated without it (config/ sections; comm/registry.py OPTION_SECTIONS)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from scaletrain.config.fields import at_least, check_choice, key
from scaletrain.config.layout import Layout
from scaletrain.errors import UserError


@dataclass(kw_only=True)
class PsOptions:
    """Parameter servers (`--strategy ps-sync` or `ps-async`; docs/strategies.md)."""

    servers: int = field(default=1, metadata=key("ps_servers"))
    """With ps-sync/ps-async: how many of the nproc x nnodes processes are parameter servers (the last
    ones); the rest are workers. The parameters are split evenly over the servers."""

    fetch: int = field(default=1, metadata=key("ps_fetch"))
    """ps-async: a worker fetches fresh parameters every this many steps (Downpour's n_fetch)."""

    push: int = field(default=1, metadata=key("ps_push"))
    """ps-async: a worker pushes its gradients, summed since the last push, every this many steps (n_push)."""

    optimizer: str = field(default="adagrad", metadata=key("ps_optimizer"))
    """ps-async: the update each shard applies on its own, `adagrad` (per-parameter, as Downpour) or `sgd` (plain)."""

    staleness_lr: bool = False
    """ps-async: divide each update's learning rate by its staleness (Zhang, Gupta et al. 2016)."""

    max_staleness: int | None = None
    """ps-async: drop a gradient more than this many shard updates old (its worker then fetches afresh)."""

    def __post_init__(self) -> None:
        check_choice("ps_optimizer", self.optimizer, ("adagrad", "sgd"))
        at_least(self, 1, "servers", "fetch", "push")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise UserError(f"--max-staleness must be 0 or more (got {self.max_staleness})")

    def check(self, cfg: Any) -> None:  # a TrainConfig (config/ imports this module)
        """What the servers refuse of the rest of the configuration."""
        strategy = cfg.strategy.name
        if cfg.model.precision == "fp16":
            raise UserError(f"--precision fp16 is not supported with --strategy {strategy} (the servers apply "
                            "unscaled gradients): use --precision bf16 or fp32")
        if cfg.model.sync_bn:
            raise UserError(f"--sync-bn is not supported with --strategy {strategy}: drop --sync-bn")

    def shape(self, layout: Layout, cfg: Any = None) -> Layout:
        """The job's last `servers` ranks serve; the rest train, each on its own data."""
        return dataclasses.replace(layout, servers=self.servers)

    def check_layout(self, cfg: Any, layout: Layout) -> None:
        if layout.trainers < 1:
            raise UserError(f"--strategy {cfg.strategy.name} with --ps-servers {self.servers} needs more processes "
                            f"than servers (got {layout.world}): raise --nproc to at least {self.servers + 1}")
