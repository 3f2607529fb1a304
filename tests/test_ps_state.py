"""A parameter server's state for checkpoints, in one process: packed, loaded into a fresh server, it
continues bit for bit; a resume that cannot continue is refused in one line (ps/resume.py)."""

import pytest
import torch

from scaletrain.train import checkpoint
from scaletrain.config import TrainConfig
from scaletrain.distributed.rank import RankInfo
from scaletrain.errors import UserError
from scaletrain.comm.ps import protocol as msg
from scaletrain.comm.ps.links import Links
from scaletrain.config.layout import Layout
from scaletrain.comm.ps.resume import saved_state
from scaletrain.comm.ps.server import AsyncServer, ServerConfig, Shard, SyncServer
from scaletrain.comm.ps.shard import bounds, pieces
from scaletrain.comm.ps.stats import ServerLog, WorkerLog

WORKERS, SERVERS = 2, 2


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def _server(kind, cfg, seed, index=1):
    """Server `index` of SERVERS over a small model (its second shard cuts the first layer's weight)."""
    params = list(_model(seed).parameters())
    sizes = [p.numel() for p in params]
    cuts = bounds(sum(sizes), SERVERS)
    shard = Shard(params, pieces(sizes, [p.ndim > 1 for p in params], cuts[index], cuts[index + 1]))
    layout = Layout(per_node=WORKERS + SERVERS, servers=SERVERS)
    links = Links(layout, RankInfo(WORKERS + index, 0, WORKERS + SERVERS, 1), True, layout.server_of(WORKERS + index))
    log = ServerLog(index, shard.numel, cfg.strategy.name, workers={w: WorkerLog() for w in range(WORKERS)})
    return kind(ServerConfig.of(cfg), links, shard, log, 6)


def _grads(n, numel, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=g) for _ in range(n)]


def _sync_cfg(**kw):
    return TrainConfig.from_dict(dict(strategy="ps-sync", ps_servers=SERVERS, optimizer="nesterov", lr=0.05, epochs=2,
                       warmup_epochs=0.5, **kw))


def test_pack_is_a_snapshot_and_loads_weights_only():
    t = torch.arange(4.0)
    packed = msg.pack({"values": [t], "n": 3, "name": "x", "none": None})
    t += 1
    out = msg.unpack(packed)
    assert packed.dtype == torch.uint8 and torch.equal(out["values"][0], torch.arange(4.0))
    assert out["n"] == 3 and out["name"] == "x" and out["none"] is None


def test_sync_server_state_round_trip_continues_bit_for_bit():
    cfg = _sync_cfg()
    a = _server(SyncServer, cfg, seed=0)
    grads = _grads(5, a.shard.numel)
    for g in grads[:3]:
        a.update(g)
        a.log.workers[0].pushes += 1
    saved = msg.unpack(msg.pack(a.state_dict()))
    b = _server(SyncServer, cfg, seed=99)  # other initial values: all must come from the state
    b.load_state_dict(saved)
    for x, y in zip(a.shard.tensors, b.shard.tensors):
        assert torch.equal(x, y)
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["state"].keys() == sb["state"].keys() and len(sa["state"]) == len(a.shard.tensors)
    for key, state in sa["state"].items():
        assert torch.equal(state["momentum_buffer"], sb["state"][key]["momentum_buffer"])
    assert b.scheduler.last_epoch == a.scheduler.last_epoch == 3
    assert [g["lr"] for g in b.optimizer.param_groups] == [g["lr"] for g in a.optimizer.param_groups]
    assert b.log.updates == 3 and b.log.workers[0].pushes == 3
    for g in grads[3:]:  # warm-up ends between these steps: the schedule continues too
        a.update(g)
        b.update(g.clone())
    for x, y in zip(a.shard.tensors, b.shard.tensors):
        assert torch.equal(x, y)


def test_async_server_state_round_trip_keeps_version_and_adagrad_sums():
    cfg = TrainConfig.from_dict(dict(strategy="ps-async", ps_servers=SERVERS, lr=0.01, epochs=2))
    a = _server(AsyncServer, cfg, seed=0)
    grads = _grads(6, a.shard.numel)
    for i, g in enumerate(grads[:4]):
        a._apply(i % WORKERS, g, read=max(0, a.version - 1), nbytes=4 * g.numel())
    saved = msg.unpack(msg.pack(a.state_dict()))
    b = _server(AsyncServer, cfg, seed=99)
    b.load_state_dict(saved)
    assert b.version == a.version == 4 and b.log.updates == 4
    assert b.log.staleness == a.log.staleness and b.log.bytes_received == a.log.bytes_received
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    for key, state in sa.items():
        assert torch.equal(state["sum"], sb[key]["sum"]) and torch.equal(state["step"], sb[key]["step"])
    for g in grads[4:]:
        assert torch.equal(a._apply(0, g, read=a.version, nbytes=0), b._apply(0, g.clone(), read=b.version, nbytes=0))
    for x, y in zip(a.shard.tensors, b.shard.tensors):
        assert torch.equal(x, y)


def test_a_state_for_another_model_is_refused_in_one_line():
    cfg = _sync_cfg()
    saved = msg.unpack(msg.pack(_server(SyncServer, cfg, seed=0, index=0).state_dict()))
    with pytest.raises(UserError, match="do not fit this model"):
        _server(SyncServer, cfg, seed=0, index=1).load_state_dict(saved)


def _checkpoint(tmp_path, strategy, ps, nproc=3, ps_servers=1):
    config = {"model": "lenet5", "dataset": "digits", "strategy": strategy, "nproc": nproc, "nnodes": 1,
              "ps_servers": ps_servers}
    checkpoint.save_atomic({"format": checkpoint.FORMAT, "config": config, "ps": ps}, tmp_path / "checkpoint.pt")


def test_resume_needs_the_layout_the_run_was_started_with(tmp_path):
    _checkpoint(tmp_path, "ps-sync", {"workers": 2, "servers": [{"mode": "ps-sync"}], "clients": [{}, {}]})
    cfg = TrainConfig.from_dict(dict(strategy="ps-sync", ps_servers=1, nproc=3, out=str(tmp_path), resume=True))
    assert saved_state(cfg, 3)["workers"] == 2
    for world, servers in ((4, 1), (4, 2), (3, 2)):
        cfg = TrainConfig.from_dict(dict(strategy="ps-sync", ps_servers=servers, nproc=world, out=str(tmp_path),
                                         resume=True))
        with pytest.raises(UserError) as e:
            saved_state(cfg, world)
        assert "holds 1 parameter server for 2 workers" in str(e.value)
        assert str(e.value).endswith("resume with --nproc 3 --ps-servers 1 as the run was started")


def test_resume_of_another_strategy_or_an_old_checkpoint_is_refused(tmp_path):
    cfg = TrainConfig.from_dict(dict(strategy="ps-sync", nproc=3, out=str(tmp_path), resume=True))
    _checkpoint(tmp_path, "allreduce", None)
    with pytest.raises(UserError, match="resume with --strategy allreduce$"):
        saved_state(cfg, 3)
    _checkpoint(tmp_path, "ps-async", {"workers": 2, "servers": [{}], "clients": [{}]})
    with pytest.raises(UserError, match="resume with --strategy ps-async$"):
        saved_state(cfg, 3)
    _checkpoint(tmp_path, "ps-sync", None)
    with pytest.raises(UserError, match="holds no parameter-server state"):
        saved_state(cfg, 3)
