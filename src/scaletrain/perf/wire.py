"""Bytes on the wire per rank, per strategy and compressor: pure functions of sizes (no tensors, no torch).

    all-reduce (bandwidth-optimal)   2 (P-1)/P x S        per rank, S bytes reduced
    ring all-reduce (comm/ring.py)   2 N - c(r+1) - c(r+2) elements, c = the chunk sizes tensor_split cuts
    all-gather (ring)                (P-1) x S            per rank, S bytes from each rank
    parameter server, per step       worker: push = sum over servers (H + payload(shard)), pull = 4 N
                                     server s: in = W (H + payload(n_s)), out = W x 4 n_s

P ranks, N values, W workers, H the parameter server's header, n_s server s's shard. The real code counts
what it sends on real tensors (comm/compress.payload_bytes); these are the same counts from sizes alone,
so a predictor can price a strategy and a compressor before anything runs (tests/test_perf_wire.py holds
the two equal).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

FP32_BYTES = 4
PS_HEADER_BYTES = 4 * 8  # a parameter-server message header: 4 int64 (comm/ps/protocol.py sends it)

Compress = tuple[str, float | int | None] | None
"""A compressor as comm/spec.parse_compress returns it: ("topk", 0.01), ("fp16", None), or None (fp32)."""



def topk_count(numel: int, ratio: float) -> int:
    """Values top-k keeps of `numel`: max(1, ceil(ratio x numel)) (comm/compress.py's TopK)."""
    return max(1, math.ceil(ratio * numel))

def allreduce_bytes(payload: int, world: int) -> int:
    """Bytes one rank sends in a bandwidth-optimal all-reduce of `payload` bytes: 2 (P-1)/P x payload."""
    return 2 * (world - 1) * payload // world if world > 1 else 0


def allgather_bytes(payload: int, world: int) -> int:
    """Bytes a rank sends in a ring all-gather of `payload` bytes from each rank: (P-1) x payload."""
    return (world - 1) * payload


def ring_chunks(numel: int, world: int) -> list[int]:
    """The ring's chunk sizes in elements, as tensor_split cuts `numel` into `world` parts."""
    return [numel // world + (1 if i < numel % world else 0) for i in range(world)]


def ring_bytes(numel: int, element_size: int, world: int, rank: int) -> int:
    """Bytes rank `rank` sends in comm/ring.ring_allreduce_ of `numel` elements: every chunk but chunk r+1 in
    the scatter-reduce, every chunk but chunk r+2 in the all-gather (indices mod P)."""
    if world == 1:
        return 0
    sizes = ring_chunks(numel, world)
    return (2 * numel - sizes[(rank + 1) % world] - sizes[(rank + 2) % world]) * element_size


def compressed_bytes(numel: int, compress: Compress = None) -> int:
    """Payload bytes of `numel` fp32 values as comm/compress.py encodes them (one buffer or shard):

        none          4 n
        fp16, bf16    2 n
        topk:r        8 k, k = max(1, ceil(r n))      fp32 values + int32 indices
        sign          ceil(n / 8) + 4                  signs packed 8 a byte + one fp32 scale
        qsgd:s        n + 4 (s <= 127), 2 n + 4        int8 or int16 levels + the fp32 norm
    powersgd compresses matrices, not a flat buffer: see powersgd_bytes."""
    if compress is None:
        return FP32_BYTES * numel
    name, arg = compress
    if name in ("fp16", "bf16"):
        return 2 * numel
    if name == "topk":
        return 2 * FP32_BYTES * topk_count(numel, arg)
    if name == "sign":
        return math.ceil(numel / 8) + FP32_BYTES
    if name == "qsgd":
        return (1 if arg <= 127 else 2) * numel + FP32_BYTES
    if name == "powersgd":
        raise ValueError("powersgd's payload depends on the gradients' shapes: use powersgd_bytes")
    raise ValueError(f"unknown compressor {name!r}")


def linear(compress: Compress) -> bool:
    """Whether ranks can sum the encoding (all-reduce it): fp32, fp16, bf16; the others are all-gathered."""
    return compress is None or compress[0] in ("fp16", "bf16", "powersgd")


def ddp_bytes(numel: int, world: int, compress: Compress = None) -> int:
    """Bytes one rank sends for one DDP bucket of `numel` fp32 values (--strategy allreduce, --compress):
    linear codes all-reduce their payload, the others all-gather it (comm/hooks.py). A step sends the sum
    over its buckets."""
    payload = compressed_bytes(numel, compress)
    return allreduce_bytes(payload, world) if linear(compress) else allgather_bytes(payload, world)


def powersgd_bytes(shapes: Iterable[Sequence[int]], rank: int, element_size: int = FP32_BYTES) -> int:
    """Payload bytes of PyTorch's PowerSGD hook (once compressing) for a bucket of gradients of `shapes`:
    a gradient seen as an n x m matrix (n = its first dimension) whose factors are smaller than it,
    (n + m) min(r, n, m) < n m, sends its fp32 P and Q factors, (n + m) min(r, n, m) x 4 bytes; the rest
    (vectors, small matrices) goes uncompressed, numel x element_size (PowerSGD's own rule, with no minimum
    compression rate)."""
    total = 0
    for shape in shapes:
        numel = math.prod(shape)
        n = shape[0] if len(shape) > 1 else numel
        m = numel // n
        factors = (n + m) * min(rank, n, m)
        total += factors * FP32_BYTES if len(shape) > 1 and factors < n * m else numel * element_size
    return total


def ps_push_bytes(shards: Sequence[int], compress: Compress = None, header_bytes: int = PS_HEADER_BYTES) -> int:
    """Bytes one worker sends in one push: to each server a header, then the gradient of its shard (`shards`:
    the values per server), fp32 or encoded. Uncompressed: 4 N + S x H."""
    return sum(header_bytes + compressed_bytes(n, compress) for n in shards)


def ps_pull_bytes(shards: Sequence[int], fetch: bool = False, header_bytes: int = PS_HEADER_BYTES) -> int:
    """Bytes one worker receives in one pull: every server's shard in fp32, 4 N; ps-async's answer to a
    FETCH puts a header (the shard's version) before each: 4 N + S x H."""
    return sum(FP32_BYTES * n + (header_bytes if fetch else 0) for n in shards)


def ps_server_bytes(shard: int, pushes: int, pulls: int, compress: Compress = None, asynchronous: bool = False,
                    header_bytes: int = PS_HEADER_BYTES) -> tuple[int, int]:
    """(received, sent) on one server's link, for `pushes` pushes and `pulls` pulls of its `shard` values.

    ps-sync (a step: pushes = pulls = W): in W (H + payload), out W x 4 n_s.
    ps-async: each push is answered by a header (applied, staleness, version), each pull is a FETCH header
    in and a header and the shard out: in pushes (H + payload) + pulls H, out pushes H + pulls (H + 4 n_s)."""
    received = pushes * (header_bytes + compressed_bytes(shard, compress))
    sent = pulls * FP32_BYTES * shard
    if asynchronous:
        received += pulls * header_bytes
        sent += (pushes + pulls) * header_bytes
    return received, sent
