"""What a parameter server's exchange costs a step (Strategy.cost, predict/pricing.py; docs/predict.md).

ps-sync: every worker pushes its gradient to the servers, each applies the update on its shard and sends it
back: 2 alpha + 2 W x (its shard) x beta on the busiest server link, plus the apply.
ps-async: a worker's own push and pull; the server link is shared, so a worker also waits for its share of
the others' traffic once that exceeds its own compute."""

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
    apply = pr.optimizer_s(max(1, len(grads) // servers), int(shard // 4))
    own = 2 * alpha + (push + shard) * beta
    if synchronous:
        exposed = 2 * alpha + workers * (push + shard) * beta + apply
    else:
        server_busy = workers * ((push + shard) * beta + apply)
        exposed = max(own + apply, server_busy - pr.phases["forward"] - pr.phases["backward"])
    comm = {"bytes_per_step": int(servers * push), "buckets": servers, "comm_total_s": exposed,
            "comm_hidden_s": 0.0, "overlap_ratio": 0.0 if workers else None}
    return Cost(exposed + pr.residual_s, comm)
