"""`--strategy ps-sync` and `ps-async`: a sharded parameter server (server.py) and its workers (client.py).

The last `--ps-servers` ranks of the job serve; the others train. A worker's view of the job is its
rank among the workers (`Links.rank`, derived from the job's RankInfo in links.join).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from scaletrain.comm.ps import links as ps_links
from scaletrain.comm.ps.client import AsyncClient, Client, SyncClient
from scaletrain.comm.ps.resume import saved_state
from scaletrain.comm.ps.server import AsyncServer, Server, ServerConfig, SyncServer, serve
from scaletrain.comm.ps.stats import summarize
from scaletrain.comm.strategy import SERVER, WORKER, Strategy
from scaletrain.config import Layout, TrainConfig
from scaletrain.distributed.device import choose_device, cpu_threads_per_rank
from scaletrain.distributed.group import gather_objects
from scaletrain.distributed.rank import RankInfo
from scaletrain.rundir import RunDir


class ParameterServer(Strategy):
    """Workers push gradients and pull parameters; the servers own the update (the local optimizer only
    tracks the schedule)."""

    worker_group = True  # the workers share a process group (evaluation, checkpoints, the profiler)
    server_class: type[Server]
    local_update = False  # the servers apply the update
    synchronous = True  # every worker's push waits for the others' (priced by comm/ps/cost.py)
    exchange_settings = ("ps_servers",)  # the servers' links are the limit: more servers, more links
    host_key = "ps"

    @classmethod
    def host_work(cls, device, threads, quick):
        """The worker's packing of its gradients and unpacking of the parameters, the server's sum and flattening
        (comm/ps/host_work.py)."""
        from scaletrain.comm.ps.host_work import rows

        return rows(device, threads, quick)

    @classmethod
    def cost(cls, pricing):
        from scaletrain.comm.ps.cost import price

        return price(pricing, cls.synchronous)

    @classmethod
    def memory(cls, cfg: TrainConfig, memory_at, factory, sample_shape):
        """A worker (the fullest rank: a server holds only its shard and the shard's optimizer state): the
        weights and their gradients, no optimizer state (its optimizer is never stepped) and no gradient buckets;
        the activations as a data-parallel rank's."""
        from scaletrain.perf.footprint import Footprint

        mm = memory_at(cfg.optim.batch_size)
        return Footprint(params=2 * mm.param_bytes, activations=mm.activations())

    @staticmethod
    def check_resume(cfg: TrainConfig, world_size: int) -> None:
        saved_state(cfg, world_size)  # shards and data order depend on the layout: refused before launching

    @classmethod
    def create(cls, cfg: TrainConfig, rank: RankInfo) -> "ParameterServer":
        # a resume that cannot continue (another layout) is refused on every rank alike, before any rank waits
        saved = saved_state(cfg, rank.world_size) if cfg.launch.resume else None
        layout = cfg.ps.shape(Layout(per_node=rank.world_size))  # the ranks as launched (torchrun's too)
        is_server = layout.server_of(rank.rank) is not None
        device = torch.device("cpu") if is_server else choose_device(cfg.launch.device, rank)
        if device.type == "cpu":
            torch.set_num_threads(cpu_threads_per_rank(rank.local_world_size, cfg.launch.threads))
        backend = "nccl" if device.type == "cuda" else "gloo"
        links = ps_links.join(rank, layout, worker_group=cls.worker_group, backend=backend, device=device)
        return cls(cfg, links, device, backend, saved)

    def __init__(self, cfg: TrainConfig, links: ps_links.Links, device: torch.device, backend: str,
                 saved: dict[str, Any] | None) -> None:
        super().__init__(cfg, links.rank, device, backend)
        self.links, self.saved = links, saved
        self.role = SERVER if links.is_server else WORKER
        self.client: Client | None = None

    def serve(self, model: torch.nn.Module) -> None:
        serve(ServerConfig.of(self.cfg), self.server_class, self.links, model,
              self.saved["servers"][self.links.index] if self.saved else None)

    def wrap(self, model: torch.nn.Module, steps_per_epoch: int, sample_shape: tuple[int, ...]) -> torch.nn.Module:
        self.client = self.make_client(model, steps_per_epoch)  # the servers send their parameters
        return model

    def make_client(self, model: torch.nn.Module, steps_per_epoch: int) -> Client:
        raise NotImplementedError

    def _seed(self) -> int:
        return self.cfg.optim.seed + 7919 * self.links.index  # QSGD's random stream differs per worker

    def step(self, optimizer, scaler, prof, global_step: int) -> dict[str, Any]:
        """Push gradients, pull parameters: the servers apply the update."""
        client = self.client
        with prof.comm(client.push_bytes) as sent:
            extra = client.step(global_step)
            sent.wire = client.sent  # what the push really sent (compressed; 0 if ps-async did not push)
            sent.raw_wire = client.push_bytes if client.sent else 0
        return extra

    def state_dict(self, chief: bool) -> dict[str, Any]:
        # the servers' shards and optimizer state (ps-sync: every worker takes part, see client.py)
        return {"comm": gather_objects({}), "ps": self.client.checkpoint(chief=chief)}

    def load_state_dict(self, ckpt: dict[str, Any], global_step: int) -> None:
        # the servers loaded their part of ckpt["ps"] before sending parameters
        self.client.resume(ckpt["ps"], self.rank.rank, global_step)

    def finish(self, chief: bool) -> dict[str, Any]:
        ended = self.client.close(chief=chief)  # worker 0: once every worker has finished
        if not chief:
            return {}
        done, dead = ended
        run = RunDir(Path(self.cfg.launch.out))
        servers = [json.loads(run.ps_server(s).read_text()) for s in range(self.cfg.ps.servers)]
        return {"ps": {**summarize(servers), "workers": self.rank.world_size, "workers_finished": done,
                       "workers_died": dead}}


class SyncParameterServer(ParameterServer):
    """ps-sync: every step the servers wait for every worker: the same trajectory as allreduce."""

    server_class = SyncServer

    def make_client(self, model: torch.nn.Module, steps_per_epoch: int) -> Client:
        return SyncClient(self.links, model, steps_per_epoch, self.cfg.strategy.compression, self._seed())


class AsyncParameterServer(ParameterServer):
    """ps-async (Downpour SGD): workers push and fetch on their own cadence; a dead worker is tolerated."""

    worker_group = False  # no collective may wait for a worker that died
    server_class = AsyncServer
    plan_leaves_out = ("asynchronous updates change the optimisation (stale gradients), not only the time: plan "
                       "ranks configurations that train the same model; predict it alone to see its speed")
    synchronous = False
    tolerates_dead_workers = True
    lockstep = False  # workers step at their own pace: they agree only at epoch ends
    agent_per_rank = True  # one node's agent would stop every worker when one dies
    exchange_settings = ("ps_servers", "ps_push")  # pushing less often also moves fewer bytes

    def make_client(self, model: torch.nn.Module, steps_per_epoch: int) -> Client:
        cfg = self.cfg
        return AsyncClient(self.links, model, steps_per_epoch, cfg.ps.fetch, cfg.ps.push, cfg.strategy.compression,
                           self._seed())

    def eval_shard(self) -> tuple[int, int] | None:
        return (0, 1) if self.rank.is_main else None  # worker 0 alone evaluates, on the whole split

    def before_eval(self) -> None:
        self.client.fetch()  # evaluate (and save) the servers' parameters as they are now

    def finish(self, chief: bool) -> dict[str, Any]:
        entries = super().finish(chief)
        if chief:
            entries["replicas_identical"] = None  # asynchronous replicas differ by design
        return entries
