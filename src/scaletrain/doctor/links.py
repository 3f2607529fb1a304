"""The link test of `scaletrain doctor`: a short gloo all-reduce between every pair of nodes.

Each pair gets its own two-rank gloo process group (not a world group and new_group: a world group
connects every node to every other before anything can be measured, so one unreachable node would fail
all of it; a pair's group fails alone, and names the pair). Pairs are scheduled as a round-robin
tournament, so the pairs of one round share no node and run at once:

    4 nodes:  round 0: 0-3 1-2    round 1: 0-2 1-3    round 2: 0-1 2-3
    3 nodes:  round 0: 1-2        round 1: 0-2        round 2: 0-1          (odd counts: one rests per round)

The all-reduce is timed a few times; its bus bandwidth (nccl-tests' definition: bytes x 2(n-1)/n over
the time, = bytes / time for a pair) is what each node can push through its link at once in both
directions, which is what a data-parallel step's all-reduce needs.
"""

from __future__ import annotations

import time
from datetime import timedelta

from scaletrain.perf.timing import samples

MESSAGE_BYTES = 2 << 20  # 2 MiB: 17 ms at 1 Gbit/s, well past the 4 ms token bucket of a testbed link
WARMUP_BYTES = 64 << 10
REPEATS = 3
BUDGET_S = 1.0  # after the first timed all-reduce, stop repeating once the pair has spent this long
CONNECT_S = 2.0  # per attempt: gloo tries 5 times, so a pair that cannot connect is reported after 10 s
OP_TIMEOUT_S = 10.0  # one all-reduce of MESSAGE_BYTES slower than this is below 1.7 Mbit/s: reported as such


def pair_rounds(members: list[int]) -> list[list[tuple[int, int]]]:
    """Every pair once, in rounds of disjoint pairs (the circle method); pairs as (smaller, larger)."""
    nodes = sorted(members) + ([None] if len(members) % 2 else [])
    n = len(nodes)
    rounds = []
    for _ in range(n - 1):
        pairs = [(nodes[i], nodes[n - 1 - i]) for i in range(n // 2)]
        rounds.append([tuple(sorted(p)) for p in pairs if None not in p])
        nodes = [nodes[0], nodes[-1], *nodes[1:-1]]
    return rounds


def round_timeout_s() -> float:
    """The longest one round may take when every node is alive (node 0's bound before it gives up)."""
    return 5 * CONNECT_S + OP_TIMEOUT_S * (2 * REPEATS + 1) + 5.0


def measure_pair(store, a: int, b: int, me: int) -> dict:
    """This node's side of pair (a, b): connect a two-rank gloo group through the store, warm up, time the
    all-reduce up to REPEATS times. Both sides return a record; `merge` makes the pair's from the two."""
    import torch
    import torch.distributed as dist

    record = {"a": a, "b": b, "bytes": MESSAGE_BYTES, "seconds": [], "status": "ok", "error": None}
    try:  # the pair's group meets under its own prefix of node 0's store; gloo honours GLOO_SOCKET_IFNAME
        group = dist.ProcessGroupGloo(dist.PrefixStore(f"pair/{a}-{b}", store), 0 if me == a else 1, 2,
                                      timedelta(seconds=CONNECT_S))
    except RuntimeError as e:
        return {**record, "status": "no-connection", "error": _first_line(e)}
    opts = dist.AllreduceOptions()
    opts.timeout = timedelta(seconds=OP_TIMEOUT_S)
    data = torch.ones(MESSAGE_BYTES // 4)
    def once() -> float:
        t0 = time.perf_counter()
        group.allreduce([data], opts).wait()
        return time.perf_counter() - t0

    def spent(seconds: list[float]) -> bool:  # both sides must agree: stop when either has spent the budget
        stop = torch.tensor([float(sum(seconds) > BUDGET_S)])
        group.allreduce([stop], opts).wait()
        return stop.item() > 0

    try:
        group.allreduce([torch.ones(WARMUP_BYTES // 4)], opts).wait()
        record["seconds"] = samples(once, least=1, most=REPEATS, enough=spent)
    except RuntimeError as e:
        return {**record, "status": "timeout", "error": _first_line(e)}
    return record


def merge(mine: dict, theirs: dict | None) -> dict:
    """The pair's record from both sides: the worse status, and the lower of the two sides' best bandwidth."""
    sides = [s for s in (mine, theirs) if s is not None]
    bad = next((s for s in sides if s["status"] != "ok"), None)
    if bad is not None:
        return {**bad, "bytes_per_s": None}
    best = min(s["bytes"] / min(s["seconds"]) for s in sides)
    return {**mine, "seconds": mine["seconds"], "bytes_per_s": best}


def not_run(a: int, b: int, why: str) -> dict:
    return {"a": a, "b": b, "bytes": MESSAGE_BYTES, "seconds": [], "status": "not-run", "error": why,
            "bytes_per_s": None}


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
