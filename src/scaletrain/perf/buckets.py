"""DDP's gradient buckets and how their reduction overlaps backward (pure functions; docs/perf.md).

DDP (torch 2.x) reduces gradients in buckets. After the first step its Reducer rebuilds them in the order
backward produced the gradients: walking that order it adds each gradient to the open bucket and closes
the bucket as soon as it holds at least the limit, the first limit 1 MiB and the next ones
`bucket_cap_mb` (25 MiB) by default, every limit `bucket_cap_mb` when it is set (the first bucket too).
(The Reducer also keeps gradients of different dtypes or devices apart; one dtype is modelled here.)

A bucket is ready when the last gradient in it is computed; the buckets are reduced one at a time, in
order, each starting when it is ready and its predecessor is done:

    backward   |layer L ... layer 1|
    bucket 1        [reduce 1]                   ready early: hidden behind the rest of backward
    bucket 2                      [reduce 2]      ready at the end of backward: exposed after it

so `comm_exposed` = last reduction's end - end of backward, as the profiler splits a step (docs/metrics.md).

Hidden is not free where the collective's own work needs the cores backward is using (a CPU whose cores the ranks
fill, the transport's copies on them): each bucket's CPU seconds, in the share of its reduction that overlaps
backward, lengthen backward (`compute_stolen_s`, with `comm_cpu(bytes)` given).
"""

from __future__ import annotations

from typing import Callable, Sequence

MIB = 1 << 20
FIRST_BUCKET_BYTES = MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DEFAULT_BUCKET_CAP_MB = 25.0


def bucket_limits(bucket_cap_mb: float | None = None) -> list[int]:
    """The Reducer's byte limits: the first bucket's, then the others' (the last one repeats)."""
    if bucket_cap_mb is None:
        return [FIRST_BUCKET_BYTES, int(DEFAULT_BUCKET_CAP_MB * MIB)]
    return [int(bucket_cap_mb * MIB)]


def assign_buckets(sizes: Sequence[int], bucket_cap_mb: float | None = None) -> list[list[int]]:
    """Indices into `sizes` (gradient bytes, in the order backward produces them), bucket by bucket in the
    order they are reduced."""
    limits = bucket_limits(bucket_cap_mb)
    buckets: list[list[int]] = []
    current: list[int] = []
    total, limit = 0, 0
    for i, size in enumerate(sizes):
        current.append(i)
        total += size
        if total >= limits[limit]:
            buckets.append(current)
            current, total = [], 0
            limit = min(limit + 1, len(limits) - 1)
    if current:
        buckets.append(current)
    return buckets


def backward_order(kind: str, grads: Sequence[int], autocast: bool) -> list[int]:
    """One op's parameter gradients (bytes, registration order) in the order autograd accumulates them. A linear
    layer in fp32 is one `addmm` whose backward hands its bias's gradient over first, then its weight's; under
    autocast (bf16, fp16) the weight and the bias are cast apart and their gradients arrive as registered, weight
    first, as every other op's (convolutions, norms) do in any precision (torch 2.13, hooks on each parameter's
    accumulation). A tiny bias on the wrong side of a bucket's limit makes a bucket of its own: DDP's first bucket
    closes at 1 MiB, so the MLP's last weight (2 MiB) closes it in bf16 and its bias is reduced alone after it."""
    return list(grads[::-1]) if kind == "linear" and not autocast else list(grads)


def reductions(ready_s: Sequence[float], comm_s: Sequence[float], lanes: int = 1,
               alpha_s: float = 0.0) -> list[tuple[float, float]]:
    """(start, end) of each bucket's reduction, in order, none before its bucket is ready. One lane (NCCL's one
    stream, the ring's one thread): one at a time. More (gloo's two worker threads, which take a group's
    collectives as they come): a bucket starts as soon as it is ready and a lane is free, its latency (`alpha_s`,
    at most its reduction) passing alongside the reductions before it and its bytes after theirs (they share one
    link and one memory bus)."""
    out: list[tuple[float, float]] = []
    lane_free = [0.0] * max(1, lanes)
    done = 0.0  # when the reductions so far have moved their bytes
    for ready, seconds in zip(ready_s, comm_s, strict=True):
        lane = min(range(len(lane_free)), key=lane_free.__getitem__)
        start = max(ready, lane_free[lane])
        latency = min(alpha_s, seconds)
        end = max(start + latency, done) + seconds - latency
        lane_free[lane] = done = end
        out.append((start, end))
    return out


def overlap(backward_s: float, intervals: Sequence[tuple[float, float]]) -> dict[str, float | None]:
    """Communication against a backward pass of `backward_s` seconds starting at 0: its total, the part
    hidden behind backward, the part exposed after it, and the overlap ratio (hidden / total)."""
    total = sum(end - start for start, end in intervals)
    hidden = sum(max(0.0, min(end, backward_s) - start) for start, end in intervals)
    exposed = max(0.0, max((end for _, end in intervals), default=0.0) - backward_s)
    return {"comm_total_s": total, "comm_hidden_s": hidden, "comm_exposed_s": exposed,
            "overlap_ratio": hidden / total if total > 0 else None}


def backward_overlap(grad_s: Sequence[float], grad_bytes: Sequence[int], comm_time: Callable[[int], float],
                     bucket_cap_mb: float | None = None, comm_cpu: Callable[[int], float] | None = None,
                     lanes: int = 1) -> dict:
    """One step's backward with DDP: `grad_s[i]` the backward seconds up to and including gradient i's
    computation (cumulative, in backward's order), `grad_bytes[i]` its bytes, `comm_time(bytes)` a bucket's
    reduction time (e.g. the alpha-beta model; `comm_time(0)` its latency), `comm_cpu(bytes)` the compute it
    takes from backward while it overlaps it (None: none), `lanes` the reductions that may be in flight at once
    (`reductions`: of a bucket's latency only what is not its CPU's work, `comm_cpu(0)`, passes beside the
    reduction before it, where the cores it would run on are busy). Returns the buckets, their reductions,
    `overlap` and `compute_stolen_s`."""
    if len(grad_s) != len(grad_bytes):
        raise ValueError("grad_s and grad_bytes must list the same gradients")
    buckets = assign_buckets(grad_bytes, bucket_cap_mb)
    ready = [max(grad_s[i] for i in b) for b in buckets]
    sizes = [sum(grad_bytes[i] for i in b) for b in buckets]
    beside = max(0.0, comm_time(0) - (comm_cpu(0) if comm_cpu is not None else 0.0)) if lanes > 1 else 0.0
    intervals = reductions(ready, [comm_time(n) for n in sizes], lanes, beside)
    backward_s = max(grad_s, default=0.0)
    stolen = 0.0
    if comm_cpu is not None:
        stolen = sum(comm_cpu(n) * max(0.0, min(end, backward_s) - start) / (end - start)
                     for n, (start, end) in zip(sizes, intervals) if end > start)
    return {"buckets": buckets, "bucket_bytes": sizes, "ready_s": ready, "reductions_s": intervals,
            **overlap(backward_s, intervals), "compute_stolen_s": stolen}


def best_bucket_cap(grad_s: Sequence[float], grad_bytes: Sequence[int], comm_time: Callable[[int], float],
                    caps_mb: Sequence[float | None], comm_cpu: Callable[[int], float] | None = None,
                    lanes: int = 1) -> tuple[float | None, dict]:
    """The cap among `caps_mb` (None: DDP's default) that adds the least to the step: the communication left
    exposed and the compute the hidden part takes (ties: the larger buckets, fewer messages), with its
    `backward_overlap`."""
    results = [(cap, backward_overlap(grad_s, grad_bytes, comm_time, cap, comm_cpu, lanes)) for cap in caps_mb]
    return min(results, key=lambda r: (round(r[1]["comm_exposed_s"] + r[1]["compute_stolen_s"], 12),
                                       len(r[1]["buckets"])))
