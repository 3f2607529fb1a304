"""`--strategy spatial`: each image cut into S tiles held by S consecutive ranks (`--spatial S`), the model's
front run on the tiles up to `--spatial-until`, gathered there into the whole image, and the rest run on it by
every rank of the tiles; R = world / S such groups are data-parallel replicas (docs/spatial.md).

Ranks: replica i holds ranks [i S, (i + 1) S), tile t of it is rank i S + t. Every rank of a replica reads the
same batches (its replica's shard) and keeps its own tile of each. After backward, each front parameter's
gradient is its tile's part: summed over the tiles (the tiles' group), then averaged over the replicas (the
group of each tile index); the rest of the model's gradients are the same on every tile and only averaged over
the replicas. Every rank then steps the same optimizer on the same gradients: all hold the same weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scaletrain.comm.spatial.front import (TileInput, blocked_on_meta, checkpointed_units, forward_runs, front_ends,
                                          gather_after, halo_bytes_per_sample, plan_front, tile_blocks, tile_front)
from scaletrain.comm.spatial.geometry import TileGrid, square_grid
from scaletrain.comm.spatial.halo import Tiles
from scaletrain.comm.strategy import Strategy
from scaletrain.config import TrainConfig
from scaletrain.distributed.group import all_reduce_flat, block_groups
from scaletrain.distributed.rank import RankInfo
from scaletrain.perf.precision import to_device
from scaletrain.train.evaluate import EvalResult, Tally


class Spatial(Strategy):
    computes_whole_model = False  # a tile runs its share of the front

    def __init__(self, cfg: TrainConfig, rank: RankInfo, device: torch.device, backend: str) -> None:
        super().__init__(cfg, rank, device, backend)
        self.grid = TileGrid(*square_grid(cfg.spatial.tiles))
        s = self.grid.tiles
        self.replicas = rank.world_size // s
        self.replica_index, self.tile = divmod(rank.rank, s)
        self.front_params: list[nn.Parameter] = []
        self.recomputed: list = []  # activation checkpointing's units (train/recompute.Unit)
        self.trained = {"halo_bytes": 0, "samples": 0, "steps": 0}  # what training steps sent (evaluation apart)
        # this replica's tiles, this tile index's data-parallel group (None, None: one replica)
        self.tiles_group, self.dp_group = block_groups(s, self.replicas, rank.rank)

    @classmethod
    def cost(cls, pricing):
        """The front's compute over the tiles, its halos, BatchNorm statistics and gather, the gradients' sums
        (comm/spatial/cost.py); with --stages, the tiles' pipelines (comm/spatial/staged_cost.py)."""
        if pricing.cfg.layout.stages > 1:
            from scaletrain.comm.spatial.staged_cost import staged_cost

            return staged_cost(pricing)
        from scaletrain.comm.spatial.cost import spatial_cost

        return spatial_cost(pricing)

    @classmethod
    def step_floor_s(cls, cfg: TrainConfig, facts: dict[str, Any], predictor: Any, threads: int) -> float | None:
        """With --stages, its pipelines' blocks over the stages (comm/spatial/staged_cost.floor_s); tiles alone:
        none."""
        if cfg.layout.stages <= 1:
            return None
        from scaletrain.comm.spatial.staged_cost import floor_s

        return floor_s(cfg, facts, predictor, threads)

    @classmethod
    def create(cls, cfg: TrainConfig, rank: RankInfo) -> Strategy:
        """With --stages, the tiles' pipelines (comm/spatial/pipeline.py)."""
        if cfg.layout.stages > 1:
            from scaletrain.comm.spatial.pipeline import SpatialPipeline

            return SpatialPipeline.create(cfg, rank)
        return super().create(cfg, rank)

    @staticmethod
    def check_model(cfg: TrainConfig, factory, sample_shape: tuple[int, ...]) -> None:
        """The front's layers, its boundary and the tiles' sizes, before any process starts (with --stages, the
        pipeline's checks too)."""
        if cfg.layout.stages > 1:
            from scaletrain.comm.spatial.pipeline import SpatialPipeline

            return SpatialPipeline.check_model(cfg, factory, sample_shape)
        plan_front(factory(), cfg.spatial.until, TileGrid(*square_grid(cfg.spatial.tiles)), sample_shape)

    @classmethod
    def resolve(cls, cfg: TrainConfig, factory, sample_shape, fits):
        """`--spatial-until auto` with a memory budget: the shallowest front whose plan fits it (the gather as
        early as memory allows: the fewest halos), else the deepest (as without a budget)."""
        if cfg.spatial.until != "auto":
            return cfg
        with torch.device("meta"):
            model = factory()
        ends = front_ends(model, sample_shape, TileGrid(*square_grid(cfg.spatial.tiles)))
        if cfg.layout.stages > 1:  # the tiles' pipelines gather them between two blocks
            graph = blocked_on_meta(model, sample_shape)
            ends = [e for e in ends if gather_after(graph, e) is not None]
        for end in ends:
            choice = cfg.replace(spatial_until=end)
            if fits(choice):
                return choice
        return cfg.replace(spatial_until=ends[-1]) if ends else cfg

    @classmethod
    def memory(cls, cfg: TrainConfig, memory_at, factory, sample_shape):
        """The whole model's parameters and state on every tile's rank; of the activations, the front's blocks a
        tile's share (1/S: the halo strips aside), the rest whole (each rank runs it on the gathered images). With
        --stages, the fullest stage of the tiles' pipelines (comm/spatial/pipeline.py)."""
        from scaletrain.perf.footprint import Footprint

        if cfg.layout.stages > 1:
            from scaletrain.comm.spatial.pipeline import SpatialPipeline

            return SpatialPipeline.memory(cfg, memory_at, factory, sample_shape)
        mm = memory_at(cfg.optim.batch_size)
        blocks, tile_input = tile_blocks(cfg, mm, factory, sample_shape)
        return Footprint(params=mm.state_bytes(buckets=False), activations=mm.activations(blocks) + tile_input)

    def replica(self) -> tuple[int, int]:
        return self.replica_index, self.replicas

    def eval_shard(self) -> tuple[int, int] | None:
        return self.replica_index, self.replicas  # the tiles of one image read the same batches

    def wrap(self, model: nn.Module, steps_per_epoch: int, sample_shape: tuple[int, ...]) -> nn.Module:
        s = self.grid.tiles
        base = self.replica_index * s
        self.tiles = Tiles(self.grid, self.tile, tuple(range(base, base + s)), self.tiles_group)
        front = plan_front(model, self.cfg.spatial.until, self.grid, sample_shape)
        self.front_params = tile_front(model, front, self.tiles)
        self.front, self.model = front, model
        return TileInput(model, self.tiles)

    def checkpoint_blocks(self, model: nn.Module, units: list) -> list[str]:
        # their tiled layers exchange their forward halos again in backward; a fused stem recomputes itself
        self.recomputed = checkpointed_units(units, self.front, model)
        return super().checkpoint_blocks(model, self.recomputed)

    def forward_backward(self, x, y, loss_of, optimizer, scaler, prof) -> torch.Tensor:
        with self.tiles.training_step(prof, self.trained, len(x)):
            return super().forward_backward(x, y, loss_of, optimizer, scaler, prof)

    def step(self, optimizer: torch.optim.Optimizer, scaler, prof, global_step: int) -> dict[str, Any]:
        with prof.phase("comm_exposed"):
            self._reduce_gradients(optimizer)
        return super().step(optimizer, scaler, prof, global_step)

    def _reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        front = [p.grad for p in self.front_params if p.grad is not None]
        all_reduce_flat(front, self.tiles_group)  # each tile's part -> the whole image's
        if self.replicas > 1:
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            all_reduce_flat(grads, self.dp_group, divide=self.replicas)

    def before_eval(self) -> None:
        """The front's BatchNorm statistics are the same on every tile; replicas take the first one's."""

    def evaluate(self, model: nn.Module, loader, autocast_dtype: torch.dtype | None, num_classes: int) -> EvalResult:
        """Every tile of a replica runs the same validation batches (its layers exchange halos); the first tile
        of each replica counts them."""
        from scaletrain.distributed.group import broadcast_buffers

        broadcast_buffers(model)
        module = TileInput(model, self.tiles)
        was_training = model.training
        model.eval()
        tally = Tally(self.device, num_classes)
        with torch.no_grad():
            for x, y, _bad in loader:
                if len(y) == 0:
                    continue
                with torch.autocast(self.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                    logits = module(to_device(x, self.device))
                if self.tile == 0:
                    tally.add(logits, to_device(y, self.device))
        model.train(was_training)
        return tally.result()

    def finish(self, chief: bool) -> dict[str, Any]:
        if not chief:
            return {}
        t = self.trained
        theory = halo_bytes_per_sample(self.model.get_submodule, self.front, self.tiles, _element_size(self.model),
                                       forward_runs(self.front, self.recomputed))
        return {"spatial": {"tiles": self.grid.tiles, "grid": [self.grid.rows, self.grid.cols],
                            "replicas": self.replicas, "until": self.front.until,
                            "tiled_layers": len(self.front.layers),
                            "fused_stems": [list(chain) for chain in self.front.stems],
                            "halo_bytes_per_step": t["halo_bytes"] / t["steps"] if t["steps"] else None,
                            "halo_bytes_per_step_theory": theory * t["samples"] / t["steps"] if t["steps"] else None}}


def _element_size(model: nn.Module) -> int:
    """Bytes of one activation element in the halos, taken as the parameters' (exact in fp32 and fp64; under
    bf16/fp16 autocast a layer's halo may carry 2-byte elements, which this theory does not model)."""
    p = next(model.parameters(), None)
    return p.element_size() if p is not None else 4
