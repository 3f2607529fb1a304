"""A plain DDP training loop that adopts scaletrain's step profiler in a handful of lines.

Run it on 2 CPU processes (or GPUs: it picks CUDA when present):

    python -m torch.distributed.run --nproc-per-node 2 examples/profile_my_loop.py --out runs/my-loop
    scaletrain report runs/my-loop        # phases, stragglers, diagnosis, plots, report.html

Lines marked `# scaletrain` are all it takes; the rest is an ordinary DDP script.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from scaletrain.profiler import StepProfiler  # scaletrain


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="run directory for metrics, summary.json and trace.json")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    data = TensorDataset(x, torch.tensor(digits.target))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).to(device)
    ddp = DDP(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    prof = StepProfiler(args.out, ddp)  # scaletrain: every rank, after DDP is built
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for xb, yb in prof.data(loader):  # scaletrain: time blocked on the loader = data_wait
            with prof.phase("h2d"):  # scaletrain
                xb, yb = xb.to(device), yb.to(device)
            with prof.phase("forward"):  # scaletrain
                loss = loss_fn(ddp(xb), yb)
            with prof.phase("backward"):  # scaletrain: split into compute + exposed communication
                loss.backward()
            with prof.phase("optimizer"):  # scaletrain
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            prof.step_end(loss=loss.detach(), samples=len(yb), epoch=epoch)  # scaletrain
    summary = prof.finish({"model": "mlp (example)", "dataset": "digits"})  # scaletrain: summary.json, trace.json
    if summary is not None:
        for finding in summary["diagnosis"]:
            print(f"{finding['kind']}: {finding['message']} -> {finding['lever']}")
    dist.barrier()  # leave together: a rank tearing gloo down while its peer still uses it can abort
    time.sleep(0.05)  # and let gloo's threads release the last collective's tensors first
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
