"""What fresh pages cost a CPU step (docs/perf.md, "Fresh pages"): an allocation at or above the allocator's mmap
threshold (distributed/allocator.py: 32 MiB under `steady`, 1 MiB under `lean`) is served with pages the kernel
has not given this process yet, and each is faulted in (and zeroed) when first written; on free they go back. A
tensor of that size made every step pays it every step; one under the threshold reuses the heap's memory.

`python -m scaletrain.distributed.pages POLICY` (what calibrate runs, once per policy, each in a process of its own
started with the policy's environment: lean's huge pages are read at a process's start) prints one JSON line:
`seconds_per_byte`, the time to make, fill and free a fresh 64 MiB tensor less the time to fill one already
paged in, per byte (the median of alternated rounds), and the rounds' raw times."""

from __future__ import annotations

import json
import statistics
import sys
import time

SIZE = 64 * 2**20  # above both policies' thresholds
ROUNDS = 9


def measure(rounds: int = ROUNDS, size: int = SIZE) -> dict[str, float | list[float]]:
    import torch

    kept = torch.empty(size, dtype=torch.uint8)
    kept.fill_(1)
    fresh_s, kept_s = [], []
    for _ in range(rounds):  # alternated, so that the machine's drift lands on both alike
        t0 = time.perf_counter()
        t = torch.empty(size, dtype=torch.uint8)
        t.fill_(1)
        del t  # (its pages go back: part of what a fresh tensor costs)
        t1 = time.perf_counter()
        kept.fill_(2)
        t2 = time.perf_counter()
        fresh_s.append(t1 - t0)
        kept_s.append(t2 - t1)
    extra = statistics.median(f - k for f, k in zip(fresh_s, kept_s))
    return {"seconds_per_byte": max(0.0, extra) / size, "fresh_s": fresh_s, "kept_s": kept_s}


def main(argv: list[str]) -> int:
    from scaletrain.distributed.allocator import settle

    policy = argv[0] if argv else "steady"
    settle(policy)
    print(json.dumps({"policy": policy, **measure()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
