"""A parameter-server rank: holds one shard of the parameters and its optimizer, serves the workers.

ps-sync: every step, wait for every worker's gradient shard, apply their mean with the run's optimizer
and schedule, send the new shard back to all: the same arithmetic as all-reduce + the optimizer.
ps-async (Downpour SGD): one thread per worker; each push is applied on arrival (Adagrad or plain SGD,
`--ps-optimizer`), with the learning rate divided by the gradient's staleness under `--staleness-lr`,
and dropped if older than `--max-staleness`; each fetch gets the shard as it is now. A worker whose link
breaks is recorded as died and the others go on.

At each checkpoint worker 0 asks every server for its state (protocol STATE): the shard's values, the
optimizer state (momentum buffers, Adagrad sums), the schedule's position (ps-sync: its step; ps-async:
the version) and the counters of ps-server{s}.json. A resumed server loads it before serving anything.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from scaletrain.comm.compress import make_compressor, payload_bytes
from scaletrain.comm.ps.options import PsOptions
from scaletrain.config.sections import OptimConfig
from scaletrain.errors import UserError
from scaletrain.train.optim import LRSchedule, build_scheduler, optimizer_for, peak_lr, resume_optimizer
from scaletrain.comm.ps import protocol as msg
from scaletrain.comm.ps.links import Links
from scaletrain.comm.ps.shard import Piece, bounds, pieces
from scaletrain.comm.ps.stats import ServerLog, WorkerLog
from scaletrain.rundir import RunDir, write_json_atomic


@dataclass(frozen=True)
class ServerConfig:
    """What a server needs of the run's configuration (its strategy section's settings, the optimisation)."""

    mode: str  # ps-sync or ps-async
    optim: OptimConfig
    out: str
    compression: tuple | None = None  # --compress, parsed
    ps: PsOptions = field(default_factory=PsOptions)

    @classmethod
    def of(cls, cfg) -> "ServerConfig":
        """From a TrainConfig: the strategy and its settings, the optimisation, the run directory."""
        return cls(mode=cfg.strategy.name, optim=cfg.optim, out=cfg.launch.out, compression=cfg.strategy.compression,
                   ps=cfg.ps)


class Inbox:
    """Receive buffers for one worker's push: the fp32 shard, or the shapes of its --compress encoding."""

    def __init__(self, compress: tuple | None, numel: int, key: int, world: int) -> None:
        self.codec = make_compressor(compress)
        # the payload's shapes and dtypes follow from the shard size alone: encode zeros once to learn them
        self.buffers = [torch.empty(numel)] if self.codec is None else \
            [torch.empty_like(t) for t in make_compressor(compress).encode(torch.zeros(numel), key, world)]
        self.nbytes = payload_bytes(self.buffers)

    def receive(self, links: Links, w: int) -> list:
        return [links.recv(w, t) for t in self.buffers]


def mean_gradient(inboxes: list[Inbox], numel: int, world: int) -> torch.Tensor:
    """The mean of the received pushes, decoded: linear codes are summed first, the others decoded together."""
    codec = inboxes[0].codec
    if codec is None:
        total = inboxes[0].buffers[0].clone()
        for box in inboxes[1:]:
            total += box.buffers[0]
        return total.div_(world)
    if codec.linear:  # fp16/bf16 were divided by the world size before the cast; sum in fp32
        total = sum(box.buffers[0].float() for box in inboxes)
        return codec.decode([total], numel, world)
    return codec.decode([box.buffers for box in inboxes], numel, world)


class Shard:
    """This server's values: one tensor per piece (so each keeps its parameter's optimizer group)."""

    def __init__(self, params: list[torch.Tensor], parts: list[Piece]) -> None:
        self.parts = parts
        self.tensors = [params[p.param].detach().reshape(-1)[p.start:p.stop].clone().to(torch.get_default_dtype()).requires_grad_()
                        for p in parts]
        self.numel = sum(p.numel for p in parts)

    def flat(self) -> torch.Tensor:
        return torch.cat([t.detach() for t in self.tensors])

    def load(self, values: list[torch.Tensor]) -> None:
        """The values a checkpoint saved (`tensors`, one per piece)."""
        if [v.shape for v in values] != [t.shape for t in self.tensors]:
            raise UserError("the checkpoint's parameter-server shards do not fit this model (their shapes "
                            "differ: another --width/--image-size/--stem?): resume with the original settings")
        with torch.no_grad():
            for t, v in zip(self.tensors, values):
                t.copy_(v)

    def set_grad(self, grad: torch.Tensor) -> None:
        offset = 0
        for t in self.tensors:
            t.grad = grad[offset:offset + t.numel()].to(t.dtype)  # a decoded --compress payload is float32
            offset += t.numel()


def serve(cfg: ServerConfig, server_class: type["Server"], links: Links, model: torch.nn.Module,
          saved: dict | None = None) -> None:
    """Run this server until every worker is done; writes ps-server{s}.json in the run directory.
    `saved`: this server's state from the checkpoint being resumed (see `Server.state_dict`)."""
    params = list(model.parameters())
    sizes = [p.numel() for p in params]
    cuts = bounds(sum(sizes), links.layout.servers)
    s = links.index
    shard = Shard(params, pieces(sizes, [p.ndim > 1 for p in params], cuts[s], cuts[s + 1]))
    log = ServerLog(s, shard.numel, cfg.mode,
                    workers={w: WorkerLog() for w in range(links.layout.trainers)})
    steps_per_epoch = _hello(links, log)
    server = server_class(cfg, links, shard, log, steps_per_epoch)
    if saved is not None:
        server.load_state_dict(saved)
    server.run()


def _hello(links: Links, log: ServerLog) -> int:
    """Every worker's first message: its steps per epoch (the schedule's length), equal on all of them."""
    heads = {w: msg.empty_header() for w in links.peers}
    msg.wait_all(links.recv(w, h) for w, h in heads.items())
    log.bytes_received += msg.HEADER_BYTES * len(heads)
    steps = {int(h[1]) for h in heads.values()}
    if any(int(h[0]) != msg.HELLO for h in heads.values()) or len(steps) != 1:
        raise UserError(f"parameter server {links.index}: the workers disagree on the steps per epoch "
                        f"({sorted(steps)}): every worker must run the same configuration")
    return steps.pop()


def _write_log(cfg: ServerConfig, log: ServerLog) -> None:
    write_json_atomic(RunDir(Path(cfg.out)).ps_server(log.server), log.to_dict())


class Server:
    """What both modes share: the shard, the optimizer, the log, and their state for a checkpoint."""

    optimizer: torch.optim.Optimizer

    def __init__(self, cfg: ServerConfig, links: Links, shard: Shard, log: ServerLog) -> None:
        self.cfg, self.links, self.shard, self.log = cfg, links, shard, log

    def state_dict(self) -> dict:
        """Live references, as nn.Module's: serialize at once (`protocol.pack`) for a snapshot."""
        return {"mode": self.cfg.mode, "server": self.log.server,
                "values": [t.detach() for t in self.shard.tensors],
                "optimizer": self.optimizer.state_dict(), "log": self.log.to_dict()}

    def load_state_dict(self, saved: dict) -> None:
        self.shard.load(saved["values"])
        self.log.resume(saved["log"])

    def _send_state(self, w: int, packed: torch.Tensor) -> None:
        """Not counted in bytes_sent, which is the training's traffic."""
        self.links.send(w, msg.header(packed.numel())).wait()
        self.links.send(w, packed).wait()


class SyncServer(Server):
    def __init__(self, cfg: ServerConfig, links: Links, shard: Shard, log: ServerLog, steps_per_epoch: int):
        super().__init__(cfg, links, shard, log)
        workers = links.layout.trainers
        # the optimizer and schedule of an all-reduce run with the same global batch
        self.optimizer = optimizer_for(cfg.optim, shard.tensors, [p.decay for p in shard.parts],
                                       peak_lr(cfg.optim, workers))
        self.scheduler = build_scheduler(cfg.optim, self.optimizer, steps_per_epoch, workers)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "step": self.scheduler.last_epoch}

    def load_state_dict(self, saved: dict) -> None:
        super().load_state_dict(saved)
        # as a worker resumes: the saved momentum buffers, this invocation's settings and schedule
        resume_optimizer(self.optimizer, self.scheduler, saved["optimizer"], saved["step"])

    def update(self, grad: torch.Tensor) -> None:
        """One step of the run's optimizer and schedule with the workers' mean gradient."""
        self.shard.set_grad(grad)
        self.optimizer.step()
        self.scheduler.step()
        self.log.updates += 1

    def run(self) -> None:
        links, log, workers = self.links, self.log, sorted(self.links.peers)
        self._send_all(self.shard.flat())  # the initial parameters: every worker starts from the same ones
        heads = {w: msg.empty_header() for w in workers}
        numel, world = self.shard.numel, len(workers)
        inboxes = {w: Inbox(self.cfg.compression, numel, links.index, world) for w in workers}
        while True:
            msg.wait_all(links.recv(w, heads[w]) for w in workers)
            log.bytes_received += msg.HEADER_BYTES * len(workers)
            kinds = {w: int(h[0]) for w, h in heads.items()}
            if set(kinds.values()) <= {msg.DONE, msg.WAIT}:
                break
            if set(kinds.values()) == {msg.STATE}:  # a checkpoint: all workers come, worker 0 takes it
                packed = msg.pack(self.state_dict())
                for w in workers:
                    if int(heads[w][1]):
                        self._send_state(w, packed)
                continue
            if set(kinds.values()) != {msg.PUSH}:
                raise UserError(f"parameter server {links.index}: workers out of step ({kinds}): a worker "
                                "stopped early; see its error")
            msg.wait_all([work for w in workers for work in inboxes[w].receive(links, w)])
            log.bytes_received += sum(box.nbytes for box in inboxes.values())
            # the mean, as DDP's all-reduce averages
            self.update(mean_gradient([inboxes[w] for w in workers], numel, world))
            log.staleness[0] += len(workers)
            for w in workers:
                log.workers[w].pushes += 1
                log.workers[w].applied += 1
            self._send_all(self.shard.flat())
        for w in workers:
            log.workers[w].state, log.workers[w].updates_at_end = "done", log.updates
        _write_log(self.cfg, log)
        chief = [w for w, kind in kinds.items() if kind == msg.WAIT]
        for w in chief:
            self.links.send(w, msg.header(len(workers), 0)).wait()

    def _send_all(self, flat: torch.Tensor) -> None:
        msg.wait_all([self.links.send(w, flat) for w in self.links.peers])
        self.log.bytes_sent += 4 * flat.numel() * len(self.links.peers)


def _link_error(e: Exception) -> str:
    """gloo's message without its source location and advice: 'Connection reset by peer [10.77.0.2]:41234'."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    m = re.search(r"(Connection \w+ by peer[^.]*)", text)
    return m.group(1) if m else text[:160]


class AsyncServer(Server):
    def __init__(self, cfg: ServerConfig, links: Links, shard: Shard, log: ServerLog, steps_per_epoch: int):
        super().__init__(cfg, links, shard, log)
        self.lr = peak_lr(cfg.optim, 1)  # each update carries one worker's batch
        kind = "adagrad" if cfg.ps.optimizer == "adagrad" else "plain-sgd"
        self.optimizer = optimizer_for(cfg.optim, shard.tensors, [p.decay for p in shard.parts], self.lr, kind=kind)
        # the schedule runs over the updates this shard expects: every worker's pushes
        per_epoch = max(1, steps_per_epoch * links.layout.trainers // cfg.ps.push)
        self.schedule = LRSchedule(cfg.optim, per_epoch, 1)
        self.lock = threading.Lock()
        self.finished = threading.Condition(self.lock)
        self.version = 0

    def state_dict(self) -> dict:
        return {**super().state_dict(), "version": self.version}  # the schedule is a function of it

    def load_state_dict(self, saved: dict) -> None:
        super().load_state_dict(saved)
        self.version = saved["version"]
        # the saved Adagrad sums, this invocation's settings (the LR is set at every update anyway)
        built = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        self.optimizer.load_state_dict(saved["optimizer"])
        for group, settings in zip(self.optimizer.param_groups, built):
            group.update(settings)

    def run(self) -> None:
        threads = [threading.Thread(target=self._serve, args=(w,), name=f"ps-worker{w}", daemon=True)
                   for w in sorted(self.links.peers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with self.lock:
            if not any(w.state == "done" for w in self.log.workers.values()):
                _write_log(self.cfg, self.log)
                raise UserError(f"parameter server {self.log.server}: every worker died; see their errors")

    def _serve(self, w: int) -> None:
        head, links, log = msg.empty_header(), self.links, self.log
        inbox = Inbox(self.cfg.compression, self.shard.numel, links.index, 1)  # each push is applied alone
        try:
            while True:
                links.recv(w, head).wait()
                kind = int(head[0])
                with self.lock:
                    log.bytes_received += msg.HEADER_BYTES
                if kind == msg.PUSH:
                    msg.wait_all(inbox.receive(links, w))
                    grad = mean_gradient([inbox], self.shard.numel, 1)
                    reply = self._apply(w, grad, read=int(head[1]), nbytes=inbox.nbytes)
                    links.send(w, reply).wait()
                elif kind == msg.FETCH:
                    with self.lock:
                        flat, version = self.shard.flat(), self.version
                        log.workers[w].fetches += 1
                        log.bytes_sent += msg.HEADER_BYTES + 4 * flat.numel()
                    links.send(w, msg.header(version)).wait()
                    links.send(w, flat).wait()
                elif kind == msg.STATE:
                    with self.lock:  # a consistent snapshot: no update half applied; the others wait
                        packed = msg.pack(self.state_dict())
                    if int(head[1]):
                        self._send_state(w, packed)
                elif kind in (msg.DONE, msg.WAIT):
                    self._finish(w, "done")
                    if kind == msg.WAIT:
                        self._answer_wait(w)
                    return
                else:
                    raise RuntimeError(f"unknown message kind {kind}")
        except RuntimeError as e:  # the link broke: the worker process is gone (Downpour goes on without it)
            self._finish(w, "died", error=_link_error(e))

    def _apply(self, w: int, grad: torch.Tensor, read: int, nbytes: int) -> torch.Tensor:
        cfg, log = self.cfg, self.log
        with self.lock:
            staleness = self.version - read
            log.bytes_received += nbytes
            log.workers[w].pushes += 1
            log.staleness[staleness] += 1
            applied = cfg.ps.max_staleness is None or staleness <= cfg.ps.max_staleness
            if applied:
                lr = self.lr * self.schedule(self.version)
                if cfg.ps.staleness_lr:
                    lr /= max(1, staleness)  # Zhang, Gupta et al. 2016: alpha / staleness
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                self.shard.set_grad(grad)
                self.optimizer.step()
                self.version += 1
                log.updates += 1
                log.workers[w].applied += 1
            else:
                log.dropped_stale += 1
            log.bytes_sent += msg.HEADER_BYTES
            return msg.header(int(applied), staleness, self.version)

    def _finish(self, w: int, state: str, error: str | None = None) -> None:
        with self.finished:
            log = self.log.workers[w]
            log.state, log.error, log.updates_at_end = state, error, self.version
            self.finished.notify_all()

    def _answer_wait(self, w: int) -> None:
        """Worker 0 asks at its end: answer once every worker is done or dead (its files are complete)."""
        with self.finished:
            self.finished.wait_for(lambda: all(x.state != "running" for x in self.log.workers.values()))
            states = [x.state for x in self.log.workers.values()]
            _write_log(self.cfg, self.log)
        self.links.send(w, msg.header(states.count("done"), states.count("died"))).wait()
