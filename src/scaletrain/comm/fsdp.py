"""`--strategy fsdp`: FSDP2 (`torch.distributed.fsdp.fully_shard`) for models whose parameters do not fit one
process: each of the model's blocks (perf/blocks.py; its top-level children when fx cannot trace it) is a
unit whose parameters, gradients and optimizer state are split evenly over the ranks; a unit's parameters
are all-gathered just before its forward (and again before its backward) and its gradients reduce-scattered
after (docs/strategies.md). With `--offload params` they live in host memory (FSDP2's CPUOffloadPolicy,
pinned) and the optimizer steps there.

The trajectory equals data parallelism's: every rank reads its own shard of the batch, and the
reduce-scatter averages the gradients as DDP's all-reduce does. Checkpoints hold the whole model and the
whole optimizer state (gathered to rank 0), so they are read back by any number of processes.
"""

from __future__ import annotations

import functools

import hashlib
from typing import Any

import torch
from torch import nn

from scaletrain.comm.strategy import Strategy
from scaletrain.config import TrainConfig
from scaletrain.distributed.rank import RankInfo


HOST_UNIT_NOTE_S = (0.8e-3, 2.3e-3)
"""What FSDP added per unit and step over the same run without it, on one H200 node (ResNet-50 at one rank,
2026-11-26 and -27): 2.3 ms at batch 64, where the device waits for the host, 0.8 ms at batch 256, where most
of the host's work overlaps the device's. Named in a data sheet's notes, not priced: two points of one
machine fit no law of the overlap (docs/predict-validation.md)."""


class Fsdp(Strategy):
    """Every rank holds 1/world of each unit's parameters, gradients and optimizer state."""

    lockstep_eval = True  # every rank must run as many forwards as the others (they all-gather together)
    optimizer_state_keys = "names"  # full state dicts: optimizer state keyed by parameter name (FQN)
    host_key = "fsdp"

    @classmethod
    def host_work(cls, device, threads, quick):
        """Each optimizer's step on DTensor shards (comm/fsdp_host.py)."""
        from scaletrain.comm.fsdp_host import rows

        return rows(device, threads, quick)

    @classmethod
    def cost(cls, pricing):
        """Per step each unit's parameters all-gathered twice (before forward, before backward) and its
        gradients reduce-scattered once, on CPU between the units' compute (none of it hidden): inside
        forward and backward, where the profiler measures them."""
        from scaletrain.predict.pricing import Cost

        s, cfg = pricing.setting, pricing.cfg
        alpha, beta = pricing.link("allreduce")
        units = unit_bytes(cfg.model.name, pricing.facts, cfg.model.stem, cfg.model.width)
        f, b = collective_seconds(units, s.world, alpha, beta, pricing.skew_s())
        comm = {"bytes_per_step": int(1.5 * sum(units) * 2 * (s.world - 1) / s.world), "buckets": len(units),
                "comm_total_s": f + b, "comm_hidden_s": 0.0, "overlap_ratio": 0.0 if s.world > 1 else None}
        if getattr(pricing.predictor, "hardware", None) is not None and units:
            pricing.predictor.notes.append(
                f"--strategy fsdp on a data sheet: FSDP's host work per unit and step (its hooks, the copies into "
                f"and out of the flat parameters) is not priced; one H200 node measured "
                f"{HOST_UNIT_NOTE_S[0] * 1e3:.1f}-{HOST_UNIT_NOTE_S[1] * 1e3:.1f} ms per unit, the more the "
                f"smaller the device's step (docs/predict-validation.md): {cfg.model.name}'s {len(units)} units may "
                f"add {HOST_UNIT_NOTE_S[0] * len(units) * 1e3:.0f}-{HOST_UNIT_NOTE_S[1] * len(units) * 1e3:.0f} "
                "ms to each step")
        # each rank steps its 1/world of every tensor, as DTensors: the calibration's sharded law (comm/fsdp_host.py),
        # or where it has none (a data sheet, an older calibration) the plain one
        grads = pricing.grads
        numel = sum(grads) // 4 // max(1, s.world)
        law = pricing.host_law("seconds", optimizer=cfg.optim.optimizer) or pricing.optimizer_s
        beyond_law = pricing.loop.overheads(pricing.phases["forward"] + pricing.phases["backward"])[0]
        optimizer = (law(len(grads), numel) + beyond_law) * pricing.stretch
        return Cost(0.0, comm, phases={"forward": pricing.phases["forward"] + f,
                                       "backward": pricing.phases["backward"] + b, "optimizer": optimizer})

    @classmethod
    def memory(cls, cfg: TrainConfig, memory_at, factory, sample_shape):
        """Parameters, gradients and optimizer state in 1/world shards, plus one unit gathered whole (its weights
        and, in backward, its gradients: the largest block's); the activations as a data-parallel rank's."""
        from scaletrain.perf.footprint import Footprint

        mm = memory_at(cfg.optim.batch_size)
        unit = max((b.params for b in mm.blocks), default=0)
        world = cfg.layout.world
        return Footprint(params=mm.state_bytes(buckets=False) // world + 2 * unit, activations=mm.activations())

    def __init__(self, cfg: TrainConfig, rank: RankInfo, device: torch.device, backend: str) -> None:
        super().__init__(cfg, rank, device, backend)
        self.units: list[str] = []
        self._module: nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None

    def place(self, model: nn.Module) -> nn.Module:
        """On the device in the contiguous layout: fully_shard refuses channels-last weights (torch 2.11), the
        batches stay channels last on CUDA (perf/precision.memory_format)."""
        return model.to(self.device)

    def wrap(self, model: nn.Module, steps_per_epoch: int, sample_shape: tuple[int, ...]) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        mesh = init_device_mesh(self.device.type, (self.rank.world_size,))
        policy = CPUOffloadPolicy(pin_memory=True) if self.cfg.strategy.offload == "params" else OffloadPolicy()
        self.units = shard_units(model, sample_shape)
        for name in self.units:
            fully_shard(model.get_submodule(name), mesh=mesh, offload_policy=policy)
        fully_shard(model, mesh=mesh, offload_policy=policy)  # the rest (a stem's loose parameters) as one unit
        self._module = model
        return model

    def forward_backward(self, x, y, loss_of, optimizer, scaler, prof):
        self._optimizer = optimizer  # for the checkpoint's whole optimizer state
        return super().forward_backward(x, y, loss_of, optimizer, scaler, prof)

    # ------------------------------------------------------------ whole-model state (collective)
    def state_dict(self, chief: bool) -> dict[str, Any]:
        """The whole model and optimizer state, gathered to rank 0, in place of the shards."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model = self._module
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        if self._optimizer is None:
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            return {"comm": [], "ps": None, **({"model": get_model_state_dict(model, options=options)}
                                               if chief else {})}
        model_sd, optim_sd = get_state_dict(model, self._optimizer, options=options)
        return {"comm": [], "ps": None, **({"model": model_sd, "optimizer": optim_sd} if chief else {})}

    def load_model_state(self, model: nn.Module, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))

    def load_optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))

    def digest(self, model: nn.Module) -> str:
        """SHA-256 of the whole model's parameters (every shard gathered): equal on every rank."""
        h = hashlib.sha256()
        for p in model.parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            h.update(full.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def finish(self, chief: bool) -> dict[str, Any]:
        if not chief:
            return {}
        local = sum(p.to_local().numel() * p.element_size() if hasattr(p, "to_local") else p.numel() * p.element_size()
                    for p in self._module.parameters())
        return {"fsdp": {"shards": self.rank.world_size, "units": len(self.units) + 1,
                         "offload": self.cfg.strategy.offload,
                         "param_bytes_per_rank": local}}


def shard_units(model: nn.Module, sample_shape: tuple[int, ...]) -> list[str]:
    """The qualified names of the submodules to shard one by one: the model's blocks where a block is one
    submodule (a residual block; the children of a Sequential block), its top-level children where fx
    cannot trace it. Outermost first, none inside another."""
    from scaletrain.perf.blocks import group
    from scaletrain.perf.walk import Untraceable, layer_graph

    try:
        graph = layer_graph(model, sample_shape, 1)
    except Untraceable:
        return [name for name, child in model.named_children() if any(True for _ in child.parameters())]
    names: list[str] = []
    by_id = {n.id: n for n in graph.nodes}
    for block in group(graph, "block"):
        targets = [by_id[i].target for i in block.nodes if by_id[i].op == "call_module"]
        try:
            model.get_submodule(block.name)
            candidates = [block.name] if all(t == block.name or t.startswith(block.name + ".") for t in targets) \
                else targets
        except AttributeError:
            candidates = targets
        names += [t for t in candidates if any(True for _ in model.get_submodule(t).parameters())]
    unique = list(dict.fromkeys(names))
    return [n for n in unique if not any(n != m and n.startswith(m + ".") for m in unique)]



def collective_seconds(unit_param_bytes: list[int], world: int, alpha: float, beta: float,
                       skew: float = 0.0) -> tuple[float, float]:
    """(forward, backward) seconds of FSDP's collectives per step: per unit an all-gather before forward, one
    before backward and a reduce-scatter after it, each half an all-reduce of its bytes (alpha-beta) plus `skew`,
    the wait for the rank whose compute between two collectives ran longer (Pricing.skew_s: each unit's
    collectives hold its ranks in step; on 2 CPU ranks of ResNet-20, 14 units, torch.profiler measured 37 ms of
    gloo all-gathers in a forward of 14, 2.7 ms each, where half the idle all-reduce's latency is 0.4 ms)."""
    from scaletrain.perf import alphabeta

    if world < 2:
        return 0.0, 0.0
    half = sum(alphabeta.predict(alpha, beta, world, b) / 2 + skew for b in unit_param_bytes)
    return half, 2 * half


def unit_bytes(model_name: str, facts: dict[str, Any], stem: str, width: float) -> list[int]:
    """Parameter bytes of each unit FSDP shards (shard_units, and the root's rest), the model built on the meta
    device (no memory); kept for the process (a sweep or a plan prices many points of one model)."""
    return list(_unit_bytes(model_name, facts["classes"], facts["channels"], facts["image_size"], stem, width))


@functools.lru_cache(maxsize=32)
def _unit_bytes(model_name: str, classes: int, channels: int, size: int, stem: str, width: float) -> tuple[int, ...]:
    from scaletrain.models.registry import build_model

    with torch.device("meta"):
        model = build_model(model_name, num_classes=classes, in_channels=channels, image_size=size, stem=stem,
                            width=width)
    names = shard_units(model, (channels, size, size))
    units = [sum(p.numel() * 4 for p in model.get_submodule(n).parameters()) for n in names]
    rest = sum(p.numel() * 4 for p in model.parameters()) - sum(units)
    return tuple(units + ([rest] if rest > 0 else []))
