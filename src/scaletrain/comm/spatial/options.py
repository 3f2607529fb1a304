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
        """What the tiles refuse of the rest of the configuration."""
        if cfg.model.sync_bn:
            raise UserError("--sync-bn is not needed with --strategy spatial: the tiled BatchNorm layers already "
                            "take the whole image's statistics; drop --sync-bn")

    def shape(self, layout: Layout) -> Layout:
        """Consecutive ranks hold one image's tiles; each group of them is a data replica."""
        return dataclasses.replace(layout, tiles=self.tiles)

    def check_layout(self, cfg: Any, layout: Layout) -> None:
        if layout.world % self.tiles:
            raise UserError(f"--strategy spatial with --spatial {self.tiles} needs a multiple of {self.tiles} "
                            f"processes (got {layout.world}): --nproc {self.tiles} or "
                            f"{self.tiles * max(1, layout.world // self.tiles + 1)}")
