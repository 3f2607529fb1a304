"""`--strategy spatial --spatial S --stages K`: spatial x pipeline x data parallelism on one mesh of ranks
(docs/spatial.md), the tiled front of comm/spatial/strategy.py cut into the stages of comm/pipeline/strategy.py.

    rank = replica (K S) + stage S + tile          (R = world / (K S) replicas)

Tile t of every stage makes the pipeline of tile t: the S pipelines of a replica run the same schedule over the
same micro-batches, in lockstep. A stage whose blocks come before the gather (the end of `--spatial-until`) holds
its tile of each micro-batch (stage 0 cuts it from the batch it reads) and passes that tile on to the same tile's
next stage; its tiled layers exchange halos, and its BatchNorm layers sum statistics, with the same stage of the
other tiles (the stage's tiles group). The stage holding the front's last block gathers the tiles there (an
all-gather in its tiles group); every pipeline then runs the rest on the whole image, as `--strategy spatial`
does on every tile's rank. So the front's activations are cut S ways and spread over the stages that hold it,
the rest's over the stages after it; the rest is computed by the S pipelines alike (at batch 1, nothing else
could share it).

Gradients: a front layer's are its tile's part, summed over the tiles group; every other parameter's are the
same in all S pipelines; then each is averaged over the replicas. Every rank of a stage steps the same update.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scaletrain.comm.pipeline.strategy import Pipeline
from scaletrain.comm.spatial.front import (Cut, Gathered, blocked_on_meta, halo_bytes_per_sample, plan_front,
                                          staged_until, tile_blocks)
from scaletrain.comm.spatial.geometry import TileGrid, square_grid
from scaletrain.comm.spatial.halo import H, Tiles
from scaletrain.comm.spatial.layers import tiled
from scaletrain.config import TrainConfig
from scaletrain.distributed.group import all_reduce_flat, gather_objects, mesh_groups
from scaletrain.distributed.rank import RankInfo


class SpatialPipeline(Pipeline):
    """One stage of one tile's pipeline of one replica."""

    def __init__(self, cfg: TrainConfig, rank: RankInfo, device: torch.device, backend: str) -> None:
        self.grid = TileGrid(*square_grid(cfg.spatial.tiles))
        super().__init__(cfg, rank, device, backend)
        self.front_params: list[nn.Parameter] = []
        self.tiled_layers: dict[str, nn.Module] = {}  # this stage's front layers, tiled
        self.front: Any = None
        self.gather_at = 0  # the front's blocks: the tiles are gathered after block gather_at - 1
        self.trained = {"halo_bytes": 0, "samples": 0, "steps": 0}  # what training steps sent (evaluation apart)

    def _place_in_mesh(self, rank: int) -> tuple[int, int, Any, Any]:
        s = self.grid.tiles
        dp, pp, self.tiles_group = mesh_groups((self.replicas, self.stages, s), rank)
        replica, within = divmod(rank, self.stages * s)
        stage, self.tile = divmod(within, s)
        return stage, replica, pp, dp

    def _global(self, stage: int, replica: int | None = None) -> int:
        s = self.grid.tiles
        return ((self.replica_index if replica is None else replica) * self.stages + stage) * s + self.tile

    @property
    def _replica_size(self) -> int:
        return self.stages * self.grid.tiles

    def _chain(self) -> list[int]:
        return [s * self.grid.tiles for s in range(self.stages)]  # tile 0's pipeline of the first replica

    @property
    def _counts(self) -> bool:
        return self.is_last and self.tile == 0  # the other tiles' pipelines compute the same predictions

    # ------------------------------------------------------------ launch-time facts (no process yet)
    @staticmethod
    def check_model(cfg: TrainConfig, factory, sample_shape: tuple[int, ...]) -> None:
        """The pipeline's checks, the front's, and the front ending where a block ends (the tiles are gathered
        between two blocks, inside the stage that holds the first)."""
        Pipeline.check_model(cfg, factory, sample_shape)
        model = factory()
        grid = TileGrid(*square_grid(cfg.spatial.tiles))
        until, _ = staged_until(model, cfg.spatial.until, blocked_on_meta(model, sample_shape), sample_shape, grid)
        plan_front(model, until, grid, sample_shape)

    @classmethod
    def held_blocks(cls, cfg: TrainConfig, mm, factory, sample_shape) -> tuple[list, int]:
        return tile_blocks(cfg, mm, factory, sample_shape)

    # ------------------------------------------------------------ the worker
    def wrap(self, model: nn.Module, steps_per_epoch: int, sample_shape: tuple[int, ...]) -> nn.Module:
        s = self.grid.tiles
        first = (self.replica_index * self.stages + self.stage) * s
        self.tiles = Tiles(self.grid, self.tile, tuple(range(first, first + s)), self.tiles_group)
        return super().wrap(model, steps_per_epoch, sample_shape)

    def _split(self, model: nn.Module, graph, sample_shape):
        until, self.gather_at = staged_until(model, self.cfg.spatial.until, graph, sample_shape, self.grid)
        self.front = plan_front(model, until, self.grid, sample_shape)
        return super()._split(model, graph, sample_shape)

    def _timed_on_tiles(self) -> tuple[int, int, int]:
        return self.grid.rows, self.grid.cols, self.gather_at  # what a rank of the front runs: its tile

    def _pieces(self, graph, lo: int, hi: int, by_block: bool) -> list[tuple[list[str], nn.Module]]:
        """The stage's blocks, stage 0 cutting its tile from the batch first, the stage holding the front's last
        block gathering the tiles after it; the front's layers swapped for their tiled versions."""
        f = self.gather_at
        pieces: list[tuple[list[str], nn.Module]] = [([], Cut(self.tiles))] if lo == 0 else []
        if lo < f:
            front = super()._pieces(graph, lo, min(hi, f), by_block)
            for _, module in front:
                self.front_params += _swap_tiled(module, self.front.layers, self.tiles, self.tiled_layers)
            pieces += front + ([([], Gathered(self.tiles))] if hi >= f else [])
        if hi > f:
            pieces += super()._pieces(graph, max(lo, f), hi, by_block)
        return pieces

    def _shapes(self, graph, lo: int, hi: int, micro: int, sample_shape):
        """A cut before the gather carries the tile: the whole image's rows and columns over the grid."""
        into, out = super()._shapes(graph, lo, hi, micro, sample_shape)
        tile = lambda shape: (*shape[:H], shape[H] // self.grid.rows, shape[H + 1] // self.grid.cols)  # noqa: E731
        return (tile(into) if 0 < lo < self.gather_at else into), (tile(out) if hi < self.gather_at else out)

    def forward_backward(self, x, y, loss_of, optimizer, scaler, prof) -> torch.Tensor:
        with self.tiles.training_step(prof, self.trained, len(x)):
            return super().forward_backward(x, y, loss_of, optimizer, scaler, prof)

    def _reduce_gradients(self, prof) -> None:
        front = [p.grad for p in self.front_params if p.grad is not None]
        if front:
            with prof.phase("comm_exposed"):
                all_reduce_flat(front, self.tiles_group)  # each tile's part -> the whole image's
        super()._reduce_gradients(prof)

    def finish(self, chief: bool) -> dict[str, Any]:
        out = super().finish(chief)
        mine = self._halo_counts()
        every = gather_objects(mine)
        if not chief:
            return out
        steps = max(1, self.trained["steps"])
        # what tile 0 of the first replica sends, over the stages that hold the front
        ranks = [self._global(stage, replica=0) - self.tile for stage in range(self.stages)]
        sent = sum(every[r][0] for r in ranks)
        theory = sum(every[r][1] for r in ranks)
        return {**out, "spatial": {
            "tiles": self.grid.tiles, "grid": [self.grid.rows, self.grid.cols], "replicas": self.replicas,
            "until": self.front.until, "tiled_layers": len(self.front.layers), "stages": self.stages,
            "halo_bytes_per_step": sent / steps if self.trained["steps"] else None,
            "halo_bytes_per_step_theory": theory * self.trained["samples"] / steps if self.trained["steps"] else None}}

    def _halo_counts(self) -> tuple[int, int]:
        """(bytes this rank sent in halos in its training steps, the geometry's bytes per sample for its stage's
        layers)."""
        from dataclasses import replace

        front = replace(self.front, inputs=tuple(i for i in self.front.inputs if i[0] in self.stage_layers))
        element = next(self._model.parameters()).element_size()
        theory = halo_bytes_per_sample(self.tiled_layers.__getitem__, front, self.tiles, element,
                                       self.recomputed_layers.__contains__)
        return self.trained["halo_bytes"], theory


def _swap_tiled(piece: nn.Module, layers: tuple[str, ...], tiles: Tiles, done: dict[str, nn.Module]) -> list:
    """The front's layers that this fx piece runs swapped for their tiled versions (sharing their tensors; added to
    `done`); the parameters they bring that the layers already in `done` do not hold."""
    called = {n.target for n in piece.graph.nodes if n.op == "call_module"}
    known = {id(p) for layer in done.values() for p in layer.parameters()}
    params: list[nn.Parameter] = []
    for name in layers:
        if name not in called:
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = piece.get_submodule(parent_name) if parent_name else piece
        layer = done[name] = tiled(name, getattr(parent, attr), tiles)
        setattr(parent, attr, layer)
        for p in layer.parameters():
            if p.requires_grad and id(p) not in known:
                known.add(id(p))
                params.append(p)
    return params
