"""What the servers record (staleness, updates, dead workers, bytes) and its summary (pure functions)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class WorkerLog:
    pushes: int = 0
    applied: int = 0
    fetches: int = 0
    state: str = "running"  # then "done" or "died"
    error: str | None = None
    updates_at_end: int | None = None  # the shard's version when the worker finished or died


@dataclass
class ServerLog:
    server: int
    numel: int
    mode: str
    updates: int = 0
    dropped_stale: int = 0
    staleness: Counter = field(default_factory=Counter)
    workers: dict[int, WorkerLog] = field(default_factory=dict)
    bytes_sent: int = 0
    bytes_received: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"server": self.server, "numel": self.numel, "mode": self.mode, "updates": self.updates,
                "dropped_stale": self.dropped_stale,
                "staleness_hist": {str(k): v for k, v in sorted(self.staleness.items())},
                "workers": {str(w): vars(log) for w, log in sorted(self.workers.items())},
                "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received}

    def resume(self, saved: dict[str, Any]) -> None:
        """Continue the counters of a checkpointed run (`saved` as `to_dict` wrote it): the figures then
        cover the whole run, as the workers' records do. Every worker starts again, so none is done or died."""
        self.updates, self.dropped_stale = saved["updates"], saved["dropped_stale"]
        self.staleness = Counter({int(k): v for k, v in saved["staleness_hist"].items()})
        self.bytes_sent, self.bytes_received = saved["bytes_sent"], saved["bytes_received"]
        for w, old in saved["workers"].items():
            if int(w) in self.workers:
                log = self.workers[int(w)]
                log.pushes, log.applied, log.fetches = old["pushes"], old["applied"], old["fetches"]


def summarize(servers: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's parameter-server figures from every server's record: staleness over all updates,
    the workers that died (on any server's link), and each server's traffic."""
    hist: Counter = Counter()
    for s in servers:
        hist.update({int(k): v for k, v in s["staleness_hist"].items()})
    n = sum(hist.values())
    dead: dict[int, dict[str, Any]] = {}
    for s in servers:
        for w, log in s["workers"].items():
            if log["state"] == "died" and int(w) not in dead:
                dead[int(w)] = {"rank": int(w), "pushes": log["pushes"], "shard_updates_at_death": log["updates_at_end"],
                                "error": log["error"]}
    return {
        "mode": servers[0]["mode"] if servers else None, "servers": len(servers),
        # ps-async's workers step at their own pace: the staleness of their pushes is theirs
        "asynchronous": bool(servers) and servers[0]["mode"] == "ps-async",
        "updates_per_shard": [s["updates"] for s in servers],
        "dropped_stale": sum(s["dropped_stale"] for s in servers),
        "staleness": {"mean": sum(k * v for k, v in hist.items()) / n if n else None,
                      "p50": _quantile(hist, 0.5), "p90": _quantile(hist, 0.9),
                      "max": max(hist) if hist else None, "pushes": n,
                      "hist": {str(k): v for k, v in sorted(hist.items())}},
        "dead_workers": [dead[w] for w in sorted(dead)],
        "server_bytes_sent": [s["bytes_sent"] for s in servers],
        "server_bytes_received": [s["bytes_received"] for s in servers],
    }


def _quantile(hist: Counter, q: float) -> int | None:
    n = sum(hist.values())
    if not n:
        return None
    seen = 0
    for k in sorted(hist):
        seen += hist[k]
        if seen >= q * n:
            return k
    return max(hist)
