"""What DDP's Reducer does on the host around its buckets beyond the all-reduce itself, timed once by `scaletrain
calibrate` (`AllReduce.host_work`, the ring's too) and priced by predict/pricing.ddp_buckets (docs/predict.md).

As backward produces each gradient the Reducer copies it into its bucket, scaled by 1/P (`copy_in_s`: on the
training thread, inside backward); once the last bucket's reduction has finished it copies every reduced bucket back
into the gradients (`copy_out_s`: after backward, so all of it exposed). commbench's collectives are timed on a bare
buffer and price neither. Here (one core, 2026-11-29): a 2.6 MB MLP's 6 tensors 0.2 ms each way, where its 2-rank
step's exposed all-reduce measured 4.8-5.4 ms against 3.3 ms priced."""

from __future__ import annotations

from typing import Any

import torch

from scaletrain.perf.timing import median_time

# (tensors, values) of the gradient sets timed: the tensor counts of an MLP to ResNet-50 (6-161), 16 K-4 M values
SETS = ((8, 1 << 14), (64, 1 << 14), (8, 1 << 20), (64, 1 << 18), (160, 1 << 18), (16, 1 << 22))


def rows(device: torch.device, threads: int, quick: bool) -> list[dict[str, Any]]:
    """One row per gradient set: {threads, tensors, numel, copy_in_s, copy_out_s}."""
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    out = []
    for tensors, numel in SETS[:3] if quick else SETS:
        grads = [torch.randn(numel // tensors, device=device) for _ in range(tensors)]
        bucket = torch.zeros(sum(g.numel() for g in grads), device=device)
        views = bucket.split([g.numel() for g in grads])

        def copy_in() -> None:
            for g, v in zip(grads, views):
                torch.mul(g, 0.5, out=v)

        def copy_out() -> None:
            for g, v in zip(grads, views):
                g.copy_(v)

        repeats = 3 if quick else 5
        out.append({"threads": threads, "tensors": tensors, "numel": bucket.numel(),
                    "copy_in_s": median_time(copy_in, repeats, 0.02, sync, settled=True),
                    "copy_out_s": median_time(copy_out, repeats, 0.02, sync, settled=True)})
    return out
