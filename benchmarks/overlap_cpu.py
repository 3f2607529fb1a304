"""What hiding an all-reduce behind compute costs on this host's cores (docs/predict.md, `overlap_cpu`).

Two gloo ranks of one thread each (the cores full, as a 2-rank CPU run fills them) time, interleaved round by round
from a barrier: a block of compute alone, the all-reduce of S bytes alone (its wall and the process's CPU seconds),
and the compute with the all-reduce started just before it and waited on after it (DDP's hidden bucket). Were
hiding free, the compute beside the all-reduce would take as long as alone; the model says it takes longer by the
collective's CPU seconds. Printed per size: medians over the rounds, the ratio (beside - alone) / CPU with its spread
(p10-p90 of the per-round ratios).

    .venv/bin/python benchmarks/overlap_cpu.py [--rounds 40] [--sizes 256K,1M,4M,8M]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

COMPUTE = 20  # 256x256 matrix products per block: ~8 ms on one core here, a short backward's length


def _rank(rank: int, world: int, port: int, sizes: list[int], rounds: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def compute() -> None:
        for _ in range(COMPUTE):
            torch.mm(a, b)

    rows = []
    for size in sizes:
        buf = torch.randn(size // 4)

        def beside() -> None:
            work = dist.all_reduce(buf, async_op=True)
            compute()
            work.wait()

        modes = {"alone": compute, "allreduce": lambda: dist.all_reduce(buf), "beside": beside}
        for f in modes.values():  # warm-up
            f()
        wall = {k: [] for k in modes}
        cpu = {k: [] for k in modes}
        for _ in range(rounds):
            for k, f in modes.items():
                dist.barrier()
                c, t = time.process_time(), time.perf_counter()
                f()
                wall[k].append(time.perf_counter() - t)
                cpu[k].append(time.process_time() - c)
        rows.append((size, wall, cpu))
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--sizes", default="256K,1M,4M,8M")
    args = parser.parse_args()
    units = {"K": 1 << 10, "M": 1 << 20}
    sizes = [int(s[:-1]) * units[s[-1]] for s in args.sizes.split(",")]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, 2, 29000 + os.getpid() % 1000, sizes, args.rounds, out))
             for r in range(2)]
    for p in procs:
        p.start()
    rows = out.get()
    for p in procs:
        p.join()
    print(f"2 ranks x 1 thread, {args.rounds} interleaved rounds; medians (ms)")
    print(f"{'size':>6} {'alone':>7} {'allreduce':>10} {'its cpu':>8} {'beside':>7} {'beside-alone':>13} "
          f"{'/cpu':>6} {'p10-p90':>12}")
    for size, wall, cpu in rows:
        med = {k: statistics.median(v) * 1e3 for k, v in wall.items()}
        its_cpu = statistics.median(cpu["allreduce"]) * 1e3
        per_round = [(b - a) / c for a, b, c in zip(wall["alone"], wall["beside"], cpu["allreduce"]) if c > 0]
        print(f"{size >> 10:>5}K {med['alone']:7.2f} {med['allreduce']:10.2f} {its_cpu:8.2f} {med['beside']:7.2f} "
              f"{med['beside'] - med['alone']:13.2f} {(med['beside'] - med['alone']) / its_cpu:6.2f} "
              f"{quantile(per_round, 0.1):5.2f}-{quantile(per_round, 0.9):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
