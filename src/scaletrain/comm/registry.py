"""The strategies `--strategy` names, each in its own module: adding one is one module, one line in
STRATEGIES and one in OPTIONS (and, for settings of its own, an options section: OPTION_SECTIONS).

Values are `module:Class` paths, imported on use, so that validating a flag needs no torch.
"""

from __future__ import annotations

import importlib

STRATEGIES = {
    "allreduce": "scaletrain.comm.allreduce:AllReduce",
    "ring": "scaletrain.comm.ring:RingAllReduce",
    "ps-sync": "scaletrain.comm.ps.strategy:SyncParameterServer",
    "ps-async": "scaletrain.comm.ps.strategy:AsyncParameterServer",
    "pipeline": "scaletrain.comm.pipeline.strategy:Pipeline",
    "fsdp": "scaletrain.comm.fsdp:Fsdp",
    "spatial": "scaletrain.comm.spatial.strategy:Spatial",
}

OPTIONS = {
    "allreduce": ("compress", "bucket_cap_mb"),
    "ring": ("bucket_cap_mb",),
    "ps-sync": ("ps_servers", "compress"),
    "ps-async": ("ps_servers", "ps_fetch", "ps_push", "ps_optimizer", "staleness_lr", "max_staleness", "compress"),
    "pipeline": ("stages", "microbatches", "pipeline_schedule", "split"),
    "fsdp": (),
    "spatial": ("spatial", "spatial_until", "stages", "microbatches", "pipeline_schedule", "split"),
}
"""The strategy-specific settings each strategy takes (setting keys: StrategyConfig's or its options section's).
A setting some strategy takes, set with a strategy that does not take it, is refused (config/applies.py): it
would do nothing."""

VALUES_OF_ONE = {("offload", "params"): (("fsdp",), "FSDP2's CPU offload policy keeps the shards in host memory")}
"""Values of a setting every strategy takes that only some strategies can run with: (key, value) -> (those
strategies, why); config refuses the value with any other strategy."""

OPTION_SECTIONS = {"ps-sync": "ps", "ps-async": "ps", "pipeline": "pipeline", "spatial": "spatial"}
"""The TrainConfig section holding a strategy's own settings (comm/ps/options.py, comm/pipeline/options.py): its
`check(cfg)` refuses what the strategy cannot run with, `shape(layout)` and `check_layout(cfg, layout)` say how the
strategy divides the job's ranks (config/layout.py)."""


def strategy_class(name: str):
    """The class implementing `--strategy name` (comm/strategy.py's interface)."""
    module, _, cls = STRATEGIES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def create(cfg, rank):
    """This process's strategy, its process group(s) joined and its role decided (collective)."""
    return strategy_class(cfg.strategy.name).create(cfg, rank)
