"""The spatial strategy's settings (`--spatial`, `--spatial-until`), their checks and the layout they make: no
torch (config/ sections; comm/registry.py OPTION_SECTIONS)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from scaletrain.config.fields import key
from scaletrain.config.layout import Layout
from scaletrain.errors import UserError


@dataclass(kw_only=True)
class SpatialOptions:
    """Spatial parallelism (`--strategy spatial`; docs/spatial.md)."""

    tiles: int = field(default=2, metadata=key("spatial"))
    """With --strategy spatial: each image is cut into this many tiles, held by as many ranks, as a grid as
    square as the number allows (2: 1x2, 4: 2x2, 6: 2x3); the processes are tiles x data replicas."""

    until: str = field(default="auto", metadata=key("spatial_until"))
    """With --strategy spatial: the module (a path, e.g. layer2) at whose end the tiles are gathered into the
    whole image and the rest of the model runs data-parallel; `auto`: with --memory-per-device the shallowest
    top-level module whose planned memory per rank fits it (the fewest halos), else the deepest the tiles can
    reach (docs/spatial.md)."""

    def __post_init__(self) -> None:
        if self.tiles < 2:
            raise UserError(f"--spatial {self.tiles}: give 2 tiles or more per image (1 is --strategy allreduce)")
        if not self.until.strip():
            raise UserError("--spatial-until is empty: give a module's path (e.g. layer2) or auto")

    def check(self, cfg: Any) -> None:  # a TrainConfig (config/ imports this module)
        """What the tiles refuse of the rest of the configuration (with --stages, what the pipeline refuses too)."""
        if cfg.model.sync_bn:
            raise UserError("--sync-bn is not needed with --strategy spatial: the tiled BatchNorm layers already "
                            "take the whole image's statistics; drop --sync-bn")
        if cfg.pipeline.stages is not None:
            cfg.pipeline.check(cfg)

    def shape(self, layout: Layout, cfg: Any = None) -> Layout:
        """Consecutive ranks hold one image's tiles; with --stages K, K such groups in a row are the stages of one
        pipeline of tiles; each group of tiles x stages is a data replica."""
        stages = cfg.pipeline.stages if cfg is not None and cfg.pipeline.stages is not None else 1
        return dataclasses.replace(layout, tiles=self.tiles, stages=stages)

    def check_layout(self, cfg: Any, layout: Layout) -> None:
        group = self.tiles * layout.stages
        if layout.world % group:
            what = f"--spatial {self.tiles}" + (f" x --stages {layout.stages}" if layout.stages > 1 else "")
            raise UserError(f"--strategy spatial with {what} needs a multiple of {group} processes (got "
                            f"{layout.world}): --nproc {group} or {group * max(1, layout.world // group + 1)}")
        if layout.stages > 1 and cfg.pipeline.microbatches < layout.stages:
            raise UserError(f"--microbatches {cfg.pipeline.microbatches} is fewer than the {layout.stages} stages: a "
                            f"pipeline needs at least one micro-batch per stage; give --microbatches {layout.stages} "
                            "or more (and a --batch-size they divide)")
