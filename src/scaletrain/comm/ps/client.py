"""The worker's side of a parameter server: push gradient shards, pull parameter shards.

The model's gradients are flattened into one vector in `model.parameters()` order and cut at the
servers' boundaries (ps/shard.py); what comes back is written into the parameters in place. The local
optimizer is never stepped: the servers own the update.

A checkpoint's `ps` entry (`Client.checkpoint`, loaded back by ps/resume.py and `Client.resume`):
    {"workers": P, "servers": [each server's state, by index], "clients": [each worker's state, by rank]}
A worker's state is its compressor's (error-feedback residuals per shard, QSGD's generator); ps-async
workers share no group to gather them, so there `clients` holds worker 0's alone.
"""

from __future__ import annotations

from typing import Any

import torch

from scaletrain.comm.compress import make_compressor, payload_bytes
from scaletrain.distributed.group import gather_objects
from scaletrain.comm.ps import protocol as msg
from scaletrain.comm.ps.links import Links
from scaletrain.comm.ps.shard import bounds
from scaletrain.perf.wire import ps_push_bytes


class Client:
    """Common to both modes: the flat views, HELLO, checkpoints, the end of the run."""

    lockstep = True  # ps-sync: the servers wait for every worker at each step, checkpoints included

    def __init__(self, links: Links, model: torch.nn.Module, steps_per_epoch: int, compress: str | None = None,
                 seed: int = 0) -> None:
        self.links = links
        # --compress: each shard's gradient is encoded (error feedback kept per shard), the server decodes
        self.compressor = make_compressor(compress, seed=seed)
        self.sent = 0  # bytes of the last push
        self.params = list(model.parameters())
        self.numel = sum(p.numel() for p in self.params)
        self.cuts = bounds(self.numel, links.layout.servers)
        self.servers = sorted(links.peers)
        self.flat = torch.empty(self.numel)  # parameters as the servers last sent them (host memory)
        self._all(msg.header(msg.HELLO, steps_per_epoch))

    @property
    def push_bytes(self) -> int:
        """Bytes an uncompressed push sends: every gradient value in fp32, plus a header per server."""
        shards = [self.cuts[i + 1] - self.cuts[i] for i in range(len(self.servers))]
        return ps_push_bytes(shards, header_bytes=msg.HEADER_BYTES)

    def send_gradients(self, grad: torch.Tensor, world: int, head) -> None:
        """Header then payload to every server: the fp32 shard, or its encoding (decoded by the server,
        which averages over `world` pushes)."""
        works, sent = [], 0
        for i, s in enumerate(self.servers):
            part = self.part(grad, i)
            payload = [part] if self.compressor is None else self.compressor.encode(part, i, world)
            works += [self.links.send(s, head(i))] + [self.links.send(s, t.contiguous()) for t in payload]
            sent += msg.HEADER_BYTES + payload_bytes(payload)
        msg.wait_all(works)
        self.sent = sent

    def gradients(self) -> torch.Tensor:
        return flat_gradients(self.params)

    def load(self) -> None:
        """Write the parameters the servers sent into the model."""
        load_flat(self.params, self.flat)

    def part(self, t: torch.Tensor, s: int) -> torch.Tensor:
        return t[self.cuts[s]:self.cuts[s + 1]]

    def close(self, chief: bool) -> tuple[int, int] | None:
        """DONE to every server; worker 0 sends WAIT instead and returns (workers done, workers dead)
        once every worker has finished, so that it can read their files."""
        if not chief:
            self._all(msg.header(msg.DONE))
            return None
        self._all(msg.header(msg.WAIT))
        replies = [msg.empty_header() for _ in self.servers]
        msg.wait_all(self.links.recv(s, r) for s, r in zip(self.servers, replies))
        return int(replies[0][0]), max(int(r[1]) for r in replies)

    def checkpoint(self, chief: bool) -> dict[str, Any] | None:
        """The `ps` entry of the checkpoint, on worker 0 (None elsewhere). ps-sync: every worker calls it
        at the same point (a collective among the workers, and a round of the servers' loop)."""
        if not (chief or self.lockstep):
            return None
        clients = gather_objects(self.state_dict())  # ps-async: no group, so worker 0's alone
        servers = self.server_states(reply=chief)
        if not chief:
            return None
        return {"workers": self.links.layout.trainers, "servers": servers, "clients": clients}

    def server_states(self, reply: bool) -> list[dict[str, Any]] | None:
        """STATE to every server; with `reply`, receive each one's state (a copy of its shard, optimizer
        state and counters: about 2-3 x its shard's fp32 bytes)."""
        self._all(msg.header(msg.STATE, int(reply)))
        if not reply:
            return None
        heads = [msg.empty_header() for _ in self.servers]
        msg.wait_all(self.links.recv(s, h) for s, h in zip(self.servers, heads))
        packed = [torch.empty(int(h[0]), dtype=torch.uint8) for h in heads]
        msg.wait_all(self.links.recv(s, p) for s, p in zip(self.servers, packed))
        return [msg.unpack(p) for p in packed]

    def state_dict(self) -> dict[str, Any]:
        return {"compressor": self.compressor.state_dict() if self.compressor is not None else {}}

    def resume(self, saved: dict[str, Any], rank: int, step: int) -> None:
        """After the model was loaded from the checkpoint: this worker's state (if it was saved), and the
        parameters the servers sent again (theirs is the state that continues: in ps-async they may be
        newer than worker 0's copy in the checkpoint)."""
        clients = saved["clients"]
        if rank < len(clients) and self.compressor is not None:
            self.compressor.load_state_dict(clients[rank]["compressor"])
        self.load()

    def _all(self, head: torch.Tensor) -> None:
        msg.wait_all([self.links.send(s, head) for s in self.servers])


class SyncClient(Client):
    """ps-sync: every step, push the gradient and receive the parameters after the servers' update."""

    def __init__(self, links: Links, model: torch.nn.Module, steps_per_epoch: int, compress: str | None = None,
                 seed: int = 0) -> None:
        super().__init__(links, model, steps_per_epoch, compress, seed)
        self._receive()  # the servers' initial parameters
        self.load()

    def step(self, step: int) -> dict[str, Any]:
        self.send_gradients(self.gradients(), self.links.layout.trainers, lambda i: msg.header(msg.PUSH, 0, step))
        self._receive()
        self.load()
        return {}

    def _receive(self) -> None:
        msg.wait_all([self.links.recv(s, self.part(self.flat, s)) for s in self.servers])


class AsyncClient(Client):
    """ps-async (Downpour): accumulate gradients, push every n_push steps, fetch every n_fetch steps."""

    lockstep = False  # only worker 0 asks for the servers' state; the others go on

    def __init__(self, links: Links, model: torch.nn.Module, steps_per_epoch: int, n_fetch: int, n_push: int,
                 compress: str | None = None, seed: int = 0):
        super().__init__(links, model, steps_per_epoch, compress, seed)
        self.n_fetch, self.n_push = n_fetch, n_push
        self.versions = [0] * len(self.servers)  # each shard's version when this worker last fetched it
        self.acc = torch.zeros(self.numel)
        self.steps = 0
        self.fetch()

    def step(self, step: int) -> dict[str, Any]:
        """After backward: returns what to record with the step (staleness of a push, if one was made)."""
        self.acc += self.gradients()
        self.steps += 1
        self.sent = 0
        out: dict[str, Any] = {}
        refetch = False
        if self.steps % self.n_push == 0:
            staleness, dropped = self.push(step)
            out = {"staleness": max(staleness), "dropped_stale": dropped}
            refetch = dropped > 0  # a dropped gradient was too old: get fresh parameters at once
        if refetch or self.steps % self.n_fetch == 0:
            self.fetch()
            out["fetched"] = True
        return out

    def resume(self, saved: dict[str, Any], rank: int, step: int) -> None:
        super().resume(saved, rank, step)
        self.steps = step  # pushes and fetches keep their cadence across the break

    def push(self, step: int) -> tuple[list[int], int]:
        links = self.links
        self.send_gradients(self.acc, 1, lambda i: msg.header(msg.PUSH, self.versions[i], step))
        replies = [msg.empty_header() for _ in self.servers]
        msg.wait_all(links.recv(s, r) for s, r in zip(self.servers, replies))
        self.acc.zero_()
        return [int(r[1]) for r in replies], sum(1 - int(r[0]) for r in replies)

    def fetch(self) -> None:
        links = self.links
        self._all(msg.header(msg.FETCH))
        heads = [msg.empty_header() for _ in self.servers]
        msg.wait_all(links.recv(s, h) for s, h in zip(self.servers, heads))
        msg.wait_all(links.recv(s, self.part(self.flat, i)) for i, s in enumerate(self.servers))
        self.versions = [int(h[0]) for h in heads]
        self.load()


def flat_gradients(params: list[torch.Tensor]) -> torch.Tensor:
    """The gradients of `params` as one host vector in their order (what a push sends; zeros for a parameter
    without one)."""
    grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), device=p.device) for p in params]
    return torch.cat(grads).to(torch.get_default_dtype()).cpu()  # on CUDA a device-to-host copy (and sync) a push


def load_flat(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Write the vector `flat` (parameters in their order, as the servers sent them) into `params`."""
    with torch.no_grad():
        offset = 0
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
