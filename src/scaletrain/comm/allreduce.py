"""`--strategy allreduce`: DDP's bucketed all-reduce, overlapping backward; with `--compress`, a DDP
communication hook that encodes each bucket (comm/hooks.py) or PyTorch's PowerSGD hook."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from scaletrain.comm import setup as hook_setup
from scaletrain.comm.strategy import Profiled, Strategy
from scaletrain.config import TrainConfig
from scaletrain.distributed.group import gather_objects
from scaletrain.distributed.rank import RankInfo


class AllReduce(Strategy):
    """Every rank holds the whole model; gradients are averaged bucket by bucket during backward."""

    gradient_buckets = True
    network_fit = "allreduce"  # the calibration's collective fit its buckets are priced at
    host_key = "ddp"  # the Reducer's copies into its buckets and back (the ring's hook runs in DDP too)
    gloo_lanes = 2  # buckets in flight at once on a CPU: gloo's worker threads (ProcessGroupGloo's default, 2)

    @classmethod
    def host_work(cls, device, threads, quick):
        """DDP's copy of each gradient into its bucket and of the reduced bucket back (comm/ddp_host.py)."""
        from scaletrain.comm.ddp_host import rows

        return rows(device, threads, quick)

    @classmethod
    def cost(cls, pricing):
        """DDP's buckets overlapping backward (predict/pricing.ddp_buckets)."""
        from scaletrain.predict.pricing import ddp_buckets

        return ddp_buckets(pricing, cls.network_fit, cls.gloo_lanes if pricing.setting.cpu_compute else 1)

    def __init__(self, cfg: TrainConfig, rank: RankInfo, device: torch.device, backend: str) -> None:
        super().__init__(cfg, rank, device, backend)
        self.ddp: DDP | None = None
        self.comm = hook_setup.CommSetup()

    def hooks(self, model: torch.nn.Module) -> hook_setup.CommSetup:
        """The hook DDP runs per gradient bucket, and its state (None: DDP's own all-reduce)."""
        return hook_setup.compression(self.cfg.strategy.compression, seed=self.cfg.optim.seed + 7919 * self.rank.rank,
                                      model=model)

    def wrap(self, model: torch.nn.Module, steps_per_epoch: int, sample_shape: tuple[int, ...]) -> torch.nn.Module:
        if self.rank.world_size == 1:
            return model
        device = self.device
        cap = self.cfg.strategy.bucket_cap_mb
        if cap == "auto":
            cap = self._auto_bucket_cap()
        self.ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=cap)
        self.comm = self.hooks(model)  # collective when it creates a group (ring)
        if self.comm.hook is not None and self.cfg.profile.step_profiler == "off":
            self.ddp.register_comm_hook(self.comm.state, self.comm.hook)  # with profiling, the profiler wraps it
        return self.ddp

    def _auto_bucket_cap(self) -> float | None:
        """--bucket-cap-mb auto: time this group's all-reduce, let rank 0 choose with the model, share it."""
        from scaletrain.distributed.group import broadcast_object, time_allreduce
        from scaletrain.perf.alphabeta import fit_alpha_beta
        from scaletrain.predict import auto_bucket

        world = self.rank.world_size
        rows = [{"strategy": "allreduce", "world": world, "size": n, "time_s": time_allreduce(n, self.device)}
                for n in auto_bucket.PROBE_BYTES]
        choice = None
        if self.rank.is_main:
            alpha, beta = fit_alpha_beta(rows)
            cap, info = auto_bucket.choose(self.cfg, alpha, beta)
            print(auto_bucket.describe(info), flush=True)
            choice = (cap, info)
        self.auto_bucket = broadcast_object(choice)
        return self.auto_bucket[0]

    def finish(self, chief: bool) -> dict[str, Any]:
        ended = super().finish(chief)
        if getattr(self, "auto_bucket", None) is not None and chief:
            ended = {**(ended or {}), "bucket_cap_auto": self.auto_bucket[1]}
        return ended

    def profiled(self) -> Profiled:
        return Profiled(self.ddp, self.comm.hook, self.comm.state)

    def state_dict(self, chief: bool) -> dict[str, Any]:
        return {"comm": gather_objects(self.comm.state_dict()), "ps": None}  # compressor residuals differ per rank

    def load_state_dict(self, ckpt: dict[str, Any], global_step: int) -> None:
        saved = ckpt.get("comm") or []
        if ckpt["world_size"] == self.rank.world_size and self.rank.rank < len(saved):
            self.comm.load_state_dict(saved[self.rank.rank], self.device)
