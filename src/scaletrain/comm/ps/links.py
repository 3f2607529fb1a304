"""Who is a server, and the links between workers and servers.

Of the job's W processes (nproc x nnodes), the last S (`--ps-servers`) are servers and the first
P = W - S are workers. Every worker-server pair gets its own two-member gloo process group (a "link",
built on the launch's store), so:
  - a server serves each worker on its own thread without any ordering between workers;
  - a worker that dies breaks only its own links (its peers see "connection closed"), which is what lets
    ps-async go on without it;
  - the traffic is plain point-to-point messages whose bytes are easy to account for.
Workers of ps-sync also form the default process group among themselves (evaluation, checkpoints,
the profiler); ps-async workers share no group at all, so that no collective can wait for a dead peer.
Links carry CPU tensors; on CUDA the worker copies its gradients to the host and back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from scaletrain.config.layout import Layout
from scaletrain.distributed.rank import RankInfo

WORKER, SERVER = 0, 1  # a link's two members: the worker is rank 0 of it, the server rank 1


@dataclass
class Links:
    """This process's side of the job: its role, index and one link per peer of the other role."""

    layout: Layout
    rank: RankInfo  # for a worker: its rank among the workers (world_size = P)
    is_server: bool
    index: int  # worker rank or server index
    peers: dict[int, dist.ProcessGroup] = field(default_factory=dict)  # server index or worker rank -> link

    def send(self, peer: int, tensor: torch.Tensor) -> dist.Work:
        return self._named(peer, self.peers[peer].send([tensor], self._other(), 0))

    def recv(self, peer: int, tensor: torch.Tensor) -> dist.Work:
        return self._named(peer, self.peers[peer].recv([tensor], self._other(), 0))

    def _named(self, peer: int, work: dist.Work):
        """A worker's message to or from a server fails naming the server (a server's own failures to reach
        a worker are its business: ps-async goes on without that worker)."""
        if self.is_server:
            return work
        return ServerWork(work, f"parameter server {peer} (rank {self.layout.trainers + peer})")

    def _other(self) -> int:
        return WORKER if self.is_server else SERVER


class ServerLost(RuntimeError):
    """A worker's link to a parameter server broke: the server died, or its host is unreachable."""


@dataclass
class ServerWork:
    """A message on a worker's link to a server; a broken link is one line naming the server."""

    work: dist.Work
    server: str

    def wait(self) -> bool:
        try:
            return self.work.wait()
        except RuntimeError as e:
            cause = str(e).splitlines()[0] if str(e) else type(e).__name__
            if "] " in cause and ".cc:" in cause.split("] ", 1)[0]:
                cause = cause.split("] ", 1)[1]
            cause = cause.split(". This is typically")[0]
            raise ServerLost(f"lost {self.server}: {cause}; the server died or its host is unreachable, and the "
                             "workers cannot go on without its shard (its output: agents/ in the run directory "
                             "on one machine)") from None


def join(rank: RankInfo, layout: Layout, worker_group: bool, backend: str, device: torch.device,
         timeout_s: float = 300) -> Links:
    """Collective over the whole job: meet on the launch's store, build the links (and the workers' group)."""
    timeout = timedelta(seconds=timeout_s)
    store, _, _ = next(dist.rendezvous("env://", rank.rank, rank.world_size, timeout=timeout))
    me = rank.rank
    if layout.server_of(me) is not None:
        links = Links(layout, rank, True, layout.server_of(me))
    else:
        links = Links(layout, rank.within(layout.trainers), False, me)  # its view among the workers
        if worker_group and layout.trainers > 1:
            if device.type == "cuda":
                torch.cuda.set_device(device)
            dist.init_process_group(backend, store=dist.PrefixStore("scaletrain/workers", store), rank=me,
                                    world_size=layout.trainers, timeout=timeout,
                                    device_id=device if device.type == "cuda" else None)
    # every process builds its links in increasing (worker, server) order: one global order, no deadlock
    for w in range(layout.trainers):
        for s in range(layout.servers):
            if me in (w, layout.trainers + s):
                link_store = dist.PrefixStore(f"scaletrain/ps/{w}-{s}", store)
                group = dist.ProcessGroupGloo(link_store, SERVER if links.is_server else WORKER, 2, timeout)
                links.peers[w if links.is_server else s] = group
    return links
