"""What a parameter server's exchange costs a step (Strategy.cost, predict/pricing.py; docs/predict.md).

ps-sync: every worker packs its gradient and pushes it to the servers, each sums the pushes, applies the update on
its shard and sends it back, the worker unpacks it: 2 alpha + 2 W x (its shard) x beta on the busiest server link,
plus the apply, plus the packing on both sides (the calibration's host-work laws, comm/ps/host_work.py).
ps-async: a worker's own push and pull; the server link is shared, so a worker also waits for its share of
the others' traffic and applies once that exceeds its own compute."""

from __future__ import annotations

from scaletrain.perf import wire
from scaletrain.predict.pricing import Cost, Pricing


def price(pr: Pricing, synchronous: bool) -> Cost:
    s = pr.setting
    grads = pr.grads
    alpha, beta = pr.link("ps")
    workers, servers = s.trainers, max(1, s.servers)
    shard = sum(grads) / servers
    push = wire.compressed_bytes(int(shard // 4), s.compress) if s.compress else shard
    tensors = max(1, len(grads) // servers)
    apply = pr.optimizer_s(tensors, int(shard // 4))
    worker_law, server_law = pr.host_law("worker_s"), pr.host_law("server_s")
    worker = worker_law(len(grads), sum(grads) // 4) if worker_law else 0.0
    own = 2 * alpha + (push + shard) * beta
    if synchronous:  # a server sums every worker's push before it applies
        server = server_law(tensors, int(shard // 4), (workers - 1) * int(shard // 4)) if server_law else 0.0
        exposed = 2 * alpha + workers * (push + shard) * beta + apply + worker + server
    else:  # each push applied alone
        server = server_law(tensors, int(shard // 4)) if server_law else 0.0
        server_busy = workers * ((push + shard) * beta + apply + server)
        exposed = max(own + apply + server + worker, server_busy - pr.phases["forward"] - pr.phases["backward"])
    comm = {"bytes_per_step": int(servers * push), "buckets": servers, "comm_total_s": exposed,
            "comm_hidden_s": 0.0, "overlap_ratio": 0.0 if workers else None}
    return Cost(exposed + pr.residual_s, comm)
