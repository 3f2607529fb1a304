"""What a parameter server's exchange does on the host each step beyond its transfers and the servers' optimizer,
timed once by `scaletrain calibrate` (`ParameterServer.host_work`) and priced by comm/ps/cost.py (docs/predict.md).

The worker flattens its gradients into one vector (client.flat_gradients) and writes the parameters that come
back into the model (client.load_flat): `worker_s`. A server sums the pushes (server.mean_gradient), hands the
mean to its optimizer piece by piece (Shard.set_grad) and flattens its shard to send back (Shard.flat):
`server_s`, its pushes beyond the first in `extra_numel` (one more pass over the shard each). Each is a pass over
the values and a cost per tensor: ResNet-20's 59 tensors took 1.0 ms on the worker and 0.4 ms on the server here,
where the servers' optimizer step took 2.1 ms and commbench's `ps` fit (one plain vector) prices none of it."""

from __future__ import annotations

from typing import Any

import torch

from scaletrain.comm.ps.client import flat_gradients, load_flat
from scaletrain.comm.ps.server import Inbox, Shard, mean_gradient
from scaletrain.comm.ps.shard import pieces
from scaletrain.perf.timing import median_time

# (tensors, values) of the parameter sets timed: the tensor counts of LeNet-5 to ResNet-50 (10-161), 16 K-4 M values
SETS = ((8, 1 << 14), (64, 1 << 14), (8, 1 << 20), (64, 1 << 18), (160, 1 << 18), (16, 1 << 22))
PUSHES = (1, 3)  # a server's pushes per step: the values' sum over more workers


def rows(device: torch.device, threads: int, quick: bool) -> list[dict[str, Any]]:
    """One row per parameter set and server pushes: {threads, tensors, numel, extra_numel, worker_s, server_s}."""
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    out = []
    for tensors, numel in SETS[:3] if quick else SETS:
        params = [torch.zeros(numel // tensors, device=device, requires_grad=True) for _ in range(tensors)]
        for p in params:
            p.grad = torch.randn_like(p)
        total = sum(p.numel() for p in params)
        worker = median_time(lambda: load_flat(params, flat_gradients(params)), 3 if quick else 5, 0.02, sync,
                             settled=True)
        shard = Shard(params, pieces([p.numel() for p in params], [True] * tensors, 0, total))
        for pushes in PUSHES[:1] if quick else PUSHES:
            boxes = [Inbox(None, total, 0, pushes) for _ in range(pushes)]
            for box in boxes:
                box.buffers[0].normal_()  # not whatever torch.empty left there (denormals run slow)

            def serve() -> torch.Tensor:
                shard.set_grad(mean_gradient(boxes, total, pushes))
                return shard.flat()

            server = median_time(serve, 3 if quick else 5, 0.02, sync, settled=True)
            out.append({"threads": threads, "tensors": tensors, "numel": total, "extra_numel": (pushes - 1) * total,
                        "worker_s": worker, "server_s": server})
    return out
