"""The baseline of `overhead.py`: a minimal hand-written DDP training loop, as a user would write it.

Same model, data, sampler, loader, optimizer, LR schedule and threads as `scaletrain train`, but none of
its machinery: no run directory, no per-step log, no progress bar, no evaluation, no checkpoints.
Throughput is measured exactly as scaletrain defines it (`scaletrain.metrics`): the first
`warmup_steps(steps_per_epoch)` steps of each epoch are left out, and samples/s is the global samples of
the other steps over their summed step time. A step runs from the end of the previous one (so it includes
fetching its batch) to the end of its optimizer step; consecutive steps tile the epoch, so their summed
time is the wall time from the end of the last warm-up step to the end of the epoch, measured with two
clock reads (and a CUDA synchronize at each) instead of a sync and a clock read per step.

    python benchmarks/plain_ddp.py --model resnet20 --dataset synthetic --epochs 2   # 2 ranks, elastic agent
    python -m torch.distributed.run --nproc-per-node 2 benchmarks/plain_ddp.py ...   # or under torchrun

Rank 0 prints its result as one JSON line (and writes it to --json PATH when given).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import socket
import sys
import time
import uuid

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from scaletrain.config.applies import defaults
from scaletrain.data import build_datasets, collate
from scaletrain.distributed.device import cpu_threads_per_rank
from scaletrain.analysis.throughput import warmup_steps
from scaletrain.models import build_model

_DEFAULTS = defaults()  # every setting's default, by key


def train(p: dict) -> dict | None:
    """One rank of the loop (RANK/WORLD_SIZE/MASTER_* from the launcher); rank 0 returns the result."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    cuda = p["device"] == "cuda" or (p["device"] == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(cpu_threads_per_rank(local_world, p["threads"]))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            device_id=device if cuda else None)
    try:
        torch.manual_seed(p["seed"])  # same seed on every rank: identical initial weights
        data = build_datasets(p["dataset"], seed=p["seed"], synthetic_samples=p["synthetic_samples"],
                              augment=False)
        model = build_model(p["model"], num_classes=data.num_classes, in_channels=data.in_channels,
                            image_size=data.image_size).to(device)
        ddp = DDP(model, device_ids=[device.index] if cuda else None)
        sampler = DistributedSampler(data.train, num_replicas=world, rank=rank, shuffle=True, seed=p["seed"])
        loader = DataLoader(data.train, batch_size=p["batch_size"], sampler=sampler, num_workers=p["workers"],
                            collate_fn=collate, drop_last=True, pin_memory=cuda)
        # no weight decay on BN weights and biases (ndim <= 1), as scaletrain's optimizer does
        decay = [q for q in model.parameters() if q.ndim > 1]
        no_decay = [q for q in model.parameters() if q.ndim <= 1]
        optimizer = torch.optim.SGD([{"params": decay, "weight_decay": p["weight_decay"]},
                                     {"params": no_decay, "weight_decay": 0.0}],
                                    lr=p["lr"], momentum=p["momentum"])
        criterion = torch.nn.CrossEntropyLoss()
        torch.manual_seed(p["seed"] + 1 + rank)

        steps_per_epoch = len(loader)
        total_steps, skip = p["epochs"] * steps_per_epoch, warmup_steps(steps_per_epoch)
        step, steady_steps, steady_seconds, last_losses = 0, 0, 0.0, []
        for epoch in range(p["epochs"]):
            sampler.set_epoch(epoch)
            ddp.train()
            t_mark = time.perf_counter()
            for i, (x, y, _bad) in enumerate(loader):
                x = x.to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
                for group in optimizer.param_groups:  # cosine decay to 0 over the run, per step
                    group["lr"] = p["lr"] * (0.5 * (1.0 + math.cos(math.pi * min(1.0, step / max(1, total_steps)))))
                loss = criterion(ddp(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                step += 1
                if i == skip - 1:  # end of the warm-up steps: the steady window starts here
                    if cuda:
                        torch.cuda.synchronize()
                    t_mark = time.perf_counter()
            if cuda:
                torch.cuda.synchronize()
            steady_seconds += time.perf_counter() - t_mark
            steady_steps += steps_per_epoch - skip
            last_losses.append(loss.item())
        if rank != 0:
            return None
        samples_per_s = steady_steps * p["batch_size"] * world / steady_seconds if steady_seconds > 0 else None
        return {"samples_per_s": samples_per_s, "steady_steps": steady_steps, "steady_seconds": steady_seconds,
                "steps": step, "steps_per_epoch": steps_per_epoch, "world_size": world,
                "epoch_last_losses": last_losses, "device": device.type}
    finally:
        dist.destroy_process_group()


def _worker(p: dict) -> dict | None:
    return train(p)


def launch(p: dict, nproc: int) -> dict:
    """nproc local ranks through torch's elastic agent, configured as `scaletrain train --nproc` does."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"plain-{uuid.uuid4().hex[:8]}",
                       rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{port}", max_restarts=0,
                       monitor_interval=0.1, start_method="spawn")
    return elastic_launch(cfg, _worker)(p)[0]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--dataset", default="synthetic")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=_DEFAULTS["batch_size"], help="per rank")
    ap.add_argument("--synthetic-samples", type=int, default=_DEFAULTS["synthetic_samples"])
    ap.add_argument("--lr", type=float, default=_DEFAULTS["lr"])
    ap.add_argument("--momentum", type=float, default=_DEFAULTS["momentum"])
    ap.add_argument("--weight-decay", type=float, default=_DEFAULTS["weight_decay"])
    ap.add_argument("--workers", type=int, default=_DEFAULTS["workers"])
    ap.add_argument("--seed", type=int, default=_DEFAULTS["seed"])
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads per CPU rank (default: cores/ranks)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--nproc", type=int, default=2, help="ranks to launch (ignored under torchrun)")
    ap.add_argument("--json", help="also write rank 0's result to this file")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    p = {k: v for k, v in vars(args).items() if k not in ("nproc", "json")}
    result = train(p) if "RANK" in os.environ else launch(p, args.nproc)
    if result is not None:  # rank 0 (or the launching parent)
        line = json.dumps(result)
        print(line, flush=True)
        if args.json:
            with open(args.json, "w") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
