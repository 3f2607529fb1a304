"""FSDP's optimizer step on its DTensor shards, timed once by `scaletrain calibrate` (`Fsdp.host_work`) and priced by
`Fsdp.cost` (docs/predict.md): torch dispatches an optimizer over distributed tensors tensor by tensor, each op through
the DTensor layer, where plain tensors take its fused multi-tensor kernels. Here on one core: 64 tensors of 16 K values
7.5 ms against 0.8 ms plain; ResNet-20's 59 tensors measured 8.4-9.2 ms an optimizer phase in its FSDP runs, where the
plain law priced 1.7 ms."""

from __future__ import annotations

from typing import Any

import torch

from scaletrain.config.sections import OPTIMIZERS, OptimConfig
from scaletrain.distributed.group import alone
from scaletrain.perf.timing import median_time

# (tensors, values) of the shards timed: the tensor counts of LeNet-5 to ResNet-50 (10-161), 4 K-1 M values
SETS = ((8, 1 << 12), (32, 1 << 12), (8, 1 << 18), (64, 1 << 14), (16, 1 << 20), (160, 1 << 16))


def rows(device: torch.device, threads: int, quick: bool) -> list[dict[str, Any]]:
    """One row per optimizer and shard set on a one-rank mesh: {threads, optimizer, tensors, numel, seconds}."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from scaletrain.train.optim import optimizer_for

    sync = torch.cuda.synchronize if device.type == "cuda" else None
    out = []
    with alone(device):
        mesh = init_device_mesh(device.type, (1,))
        for name in OPTIMIZERS:
            for tensors, numel in SETS[:3] if quick else SETS:
                params = []
                for _ in range(tensors):
                    p = torch.nn.Parameter(distribute_tensor(torch.zeros(numel // tensors, device=device), mesh,
                                                             [Shard(0)]))
                    p.grad = distribute_tensor(torch.randn(numel // tensors, device=device), mesh, [Shard(0)])
                    params.append(p)
                opt = optimizer_for(OptimConfig(optimizer=name), params, [True] * tensors, 0.01)
                seconds = median_time(opt.step, 3 if quick else 5, 0.02, sync, settled=True)
                out.append({"threads": threads, "optimizer": name, "tensors": tensors, "numel": numel,
                            "seconds": seconds})
    return out
