"""Measured block costs (split/costs.py, as `--split auto` measures them) taken several times over in one
process per rank, all ranks at once: shows whether a process's first measurements match its later ones.

    .venv/bin/python tools/block_costs_repeat.py vgg11            # 2 ranks, 4 calls, thresholds fixed
    SCALETRAIN_MALLOC=default .venv/bin/python tools/block_costs_repeat.py vgg11    # glibc's dynamic thresholds

Prints each block's forward + backward per step (4 micro-batches of 8, 3x32x32 inputs, one thread per
rank), rank 0's figures, one column per call (docs/bench-pipeline.md: glibc's malloc thresholds).
"""

from __future__ import annotations

import argparse
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MICROBATCHES, MICRO, SHAPE = 4, 8, (3, 32, 32)


def worker(rank: int, port: int, model_name: str, calls: int, world: int) -> None:
    from scaletrain.models import build_model
    from scaletrain.distributed.allocator import settle
    from scaletrain.split.costs import block_costs
    from scaletrain.split.stages import blocked

    settle()  # as every scaletrain process does; SCALETRAIN_MALLOC=default leaves glibc's own thresholds
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = build_model(model_name, num_classes=10, in_channels=SHAPE[0], image_size=SHAPE[1])
        graph = blocked(model, SHAPE, MICRO)
        columns = []
        for _ in range(calls):
            dist.barrier()
            costs = block_costs(graph, model, SHAPE, MICRO, source="measured")
            columns.append([(c.forward_s + c.backward_s) * MICROBATCHES * 1e3 for c in costs])
        if rank == 0:
            print(f"{model_name}: ms per step (fwd + bwd, {MICROBATCHES} micro-batches of {MICRO}), call 1..{calls}")
            for i, name in enumerate(graph.names):
                print(f"{name:>22} " + " ".join(f"{col[i]:7.2f}" for col in columns))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a built-in model, e.g. vgg11 or resnet20")
    ap.add_argument("--calls", type=int, default=4, help="measurements in a row (default: %(default)s)")
    ap.add_argument("--ranks", type=int, default=2, help="processes measuring at once (default: %(default)s)")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, args.model, args.calls, args.ranks), nprocs=args.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
