"""How a job's ranks divide (in the spirit of torchtitan's ParallelDims): computed once from the launch
settings and the strategy's options (`TrainConfig.layout`), and asked by the launcher, the loop, predict,
watch and the report instead of formulas of their own.

    world = nodes x per_node = servers + stages x tiles x replicas

`servers`: the job's last ranks, parameter servers, which train nothing; `stages`: the ranks one pipeline
pass runs through (1 without a pipeline); `replicas`: the ranks that read different data and share the
global batch (a pipeline's replicas, a parameter server's workers, DDP's ranks); `tiles`: the ranks that hold
one image's tiles (spatial parallelism, 1 without)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    nodes: int = 1
    per_node: int = 1
    servers: int = 0
    stages: int = 1
    tiles: int = 1

    @property
    def world(self) -> int:
        return self.nodes * self.per_node

    @property
    def trainers(self) -> int:
        """Ranks that compute (every rank but the servers)."""
        return self.world - self.servers

    @property
    def replicas(self) -> int:
        """Ranks that read different data: the global batch is batch_size x replicas."""
        return max(0, self.trainers // (self.stages * self.tiles))

    def server_of(self, rank: int) -> int | None:
        """The rank's index among the servers (the job's last ranks); None for a rank that trains."""
        return rank - self.trainers if rank >= self.trainers else None

    def to_dict(self) -> dict[str, int]:
        return {"world": self.world, "nodes": self.nodes, "per_node": self.per_node, "servers": self.servers,
                "stages": self.stages, "tiles": self.tiles, "replicas": self.replicas}
