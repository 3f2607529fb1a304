"""Bytes on the wire from sizes alone (perf/wire.py): hand-computed values, and the same counts as the
real code's on real tensors (the compressors' payloads, the hooks' reports, the ring, the parameter server)."""

from types import SimpleNamespace

import pytest
import torch

from scaletrain.comm import hooks, ring
from scaletrain.comm.compress import make_compressor, payload_bytes
from scaletrain.comm.ps import protocol as msg
from scaletrain.comm.ps.client import Client
from scaletrain.comm.ps.server import Inbox, SyncServer
from scaletrain.comm.ps.shard import bounds
from scaletrain.comm.setup import _powersgd_payload
from scaletrain.comm.spec import parse_compress
from scaletrain.perf.alphabeta import bus_factor
from scaletrain.perf.wire import (PS_HEADER_BYTES, allgather_bytes, allreduce_bytes, compressed_bytes, ddp_bytes,
                                  linear, powersgd_bytes, ps_pull_bytes, ps_push_bytes, ps_server_bytes,
                                  ring_bytes, ring_chunks)

SPECS = ["fp16", "bf16", "sign", "topk:0.001", "topk:0.01", "topk:0.1", "topk:0.3", "topk:1", "qsgd:1",
         "qsgd:127", "qsgd:128", "qsgd:32767"]
SIZES = [1, 7, 8, 9, 300, 1000, 1001, 4097]


class _Done:
    """A finished dist.Work."""

    def wait(self):
        return True

    def get_future(self):
        future = torch.futures.Future()
        future.set_result(None)
        return future


def test_collectives_by_hand():
    assert [allreduce_bytes(1000, p) for p in (1, 2, 4)] == [0, 1000, 1500]
    assert allreduce_bytes(1000, 3) == 1333  # whole bytes, rounded down
    assert [allgather_bytes(100, p) for p in (1, 2, 4)] == [0, 100, 300]
    assert ring_chunks(10, 4) == [3, 3, 2, 2]
    # rank r skips chunk r+1 (scatter-reduce) and chunk r+2 (all-gather): 20 - c(r+1) - c(r+2) elements
    assert [ring_bytes(10, 4, 4, r) for r in range(4)] == [60, 64, 60, 56]
    assert ring_bytes(100, 4, 1, 0) == 0


@pytest.mark.parametrize("world", [2, 3, 4, 7])
@pytest.mark.parametrize("numel", [12, 1000, 1001])
def test_ring_sends_2_p_minus_1_over_p_per_rank(world, numel):
    per_rank = [ring_bytes(numel, 4, world, r) for r in range(world)]
    assert sum(per_rank) == 2 * (world - 1) * numel * 4  # every chunk travels P-1 hops, twice
    assert max(per_rank) - min(per_rank) <= 2 * 4  # uneven chunks differ by one element each


@pytest.mark.parametrize("world", [2, 4, 8])
def test_all_reduce_bytes_are_the_bus_factor_of_the_alpha_beta_model(world):
    assert allreduce_bytes(1 << 20, world) == bus_factor(world) * (1 << 20)


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("numel", [5, 12, 1001])
def test_ring_bytes_are_what_ring_allreduce_sends(monkeypatch, world, numel):
    # the real loop, every exchange stubbed: it returns the bytes it handed to isend
    me = SimpleNamespace(rank=0)
    monkeypatch.setattr(ring, "current_world_size", lambda group=None: world)
    monkeypatch.setattr(ring, "current_rank", lambda group=None: me.rank)
    monkeypatch.setattr(ring, "dist", SimpleNamespace(get_global_rank=lambda group, r: r))
    monkeypatch.setattr(ring, "_exchange", lambda *args: None)
    for rank in range(world):
        me.rank = rank
        assert ring.ring_allreduce_(torch.zeros(numel)) == ring_bytes(numel, 4, world, rank)


def test_compressed_payloads_by_hand():
    assert compressed_bytes(1000) == 4000
    assert compressed_bytes(1000, ("fp16", None)) == compressed_bytes(1000, ("bf16", None)) == 2000
    assert compressed_bytes(1000, ("topk", 0.01)) == 8 * 10  # 10 fp32 values + 10 int32 indices
    assert compressed_bytes(1001, ("topk", 0.01)) == 8 * 11  # k rounds up
    assert compressed_bytes(50, ("topk", 0.001)) == 8  # at least one value
    assert compressed_bytes(1001, ("sign", None)) == 126 + 4  # 8 signs a byte, and one fp32 scale
    assert compressed_bytes(1000, ("qsgd", 127)) == 1000 + 4  # int8 levels and the fp32 norm
    assert compressed_bytes(1000, ("qsgd", 128)) == 2000 + 4  # int16 above 127 levels
    with pytest.raises(ValueError, match="powersgd_bytes"):
        compressed_bytes(1000, ("powersgd", 2))


@pytest.mark.parametrize("spec", SPECS)
def test_compressed_bytes_equal_the_real_encodings_payload(spec):
    compress = parse_compress(spec)
    for n in SIZES:
        grad = torch.randn(n, generator=torch.Generator().manual_seed(n))
        comp = make_compressor(compress)
        assert payload_bytes(comp.encode(grad, 0, 2)) == compressed_bytes(n, compress), n
        assert linear(compress) == comp.linear


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("world", [2, 5])
def test_ddp_bytes_equal_what_the_compressed_hook_reports(monkeypatch, spec, world):
    def gather(outs, t, **kw):  # every rank sent the same payload
        for out in outs:
            out.copy_(t)
        return _Done()

    monkeypatch.setattr(hooks, "current_world_size", lambda group=None: world)
    monkeypatch.setattr(hooks, "dist", SimpleNamespace(all_reduce=lambda *a, **kw: _Done(), all_gather=gather))
    compress = parse_compress(spec)
    for n in (9, 1001):
        noted = []
        state = hooks.CompressState(make_compressor(compress), recorder=SimpleNamespace(note_wire=noted.append))
        buffer = torch.randn(n)
        bucket = SimpleNamespace(buffer=lambda: buffer, index=lambda: 0)
        hooks.compressed_hook(state, bucket).wait()
        assert noted == [ddp_bytes(n, world, compress)]
    assert ddp_bytes(1000, 4) == 6000 and ddp_bytes(1000, 4, ("fp16", None)) == 3000
    assert ddp_bytes(1000, 4, ("sign", None)) == 3 * (125 + 4)


def test_powersgd_bytes_by_hand_and_as_the_hook_reports_them():
    conv, bias, small, fc = (64, 3, 3, 3), (64,), (2, 2), (10, 64)
    # conv: 64 x 27, factors (64 + 27) x 2 < 1728; bias and the 2 x 2 matrix go whole; fc: (10 + 64) x 2
    assert powersgd_bytes([conv], 2) == 91 * 2 * 4
    assert powersgd_bytes([bias, small], 2) == (64 + 4) * 4
    assert powersgd_bytes([fc], 4) == 74 * 4 * 4
    assert powersgd_bytes([(3, 4)], 4) == 12 * 4  # rank min(4, 3, 4) = 3: (3 + 4) x 3 = 21 > 12, not compressed
    assert powersgd_bytes([bias], 2, element_size=2) == 128
    grads = [torch.zeros(s) for s in (conv, bias, small, fc)]
    bucket = SimpleNamespace(buffer=lambda: torch.zeros(sum(g.numel() for g in grads)), gradients=lambda: grads)
    state = SimpleNamespace(iter=5, start_powerSGD_iter=2, matrix_approximation_rank=2)
    assert _powersgd_payload(state, bucket) == powersgd_bytes([g.shape for g in grads], 2)
    state.iter = 1  # before compression starts the whole bucket goes
    assert _powersgd_payload(state, bucket) == 4 * sum(g.numel() for g in grads)


def test_parameter_server_by_hand():
    assert PS_HEADER_BYTES == msg.HEADER_BYTES
    assert ps_push_bytes([30, 31]) == 4 * 61 + 2 * 32
    assert ps_push_bytes([30, 31], ("topk", 0.1)) == 2 * 32 + 8 * 3 + 8 * 4
    assert ps_pull_bytes([30, 31]) == 4 * 61
    assert ps_pull_bytes([30, 31], fetch=True) == 4 * 61 + 2 * 32
    # ps-sync, 3 workers, a shard of 100: each pushes a header and the shard in, the new shard goes out to each
    assert ps_server_bytes(100, 3, 3) == (3 * (32 + 400), 3 * 400)
    assert ps_server_bytes(100, 3, 3, ("fp16", None)) == (3 * (32 + 200), 3 * 400)
    # ps-async: 4 pushes (answered by a header) and 2 fetches (a header in; a header and the shard out)
    assert ps_server_bytes(100, 4, 2, asynchronous=True) == (4 * 432 + 2 * 32, 4 * 32 + 2 * 432)
    # commbench's ps round (one shard, no headers): the server sends (P-1) S, a worker S
    assert ps_server_bytes(256, 3, 3, header_bytes=0)[1] == 3 * 1024 and ps_push_bytes([256], header_bytes=0) == 1024


def _client(numel, servers, compress):
    """A worker's Client without links: its shards, its compressor, links that complete at once."""
    client = Client.__new__(Client)
    client.links = SimpleNamespace(send=lambda s, t: _Done())
    client.compressor = make_compressor(compress)
    client.numel, client.cuts, client.servers = numel, bounds(numel, servers), list(range(servers))
    return client


@pytest.mark.parametrize("spec", [None, "fp16", "sign", "topk:0.01", "qsgd:127"])
@pytest.mark.parametrize("servers", [1, 2, 3])
def test_ps_push_bytes_equal_what_a_worker_sends(spec, servers):
    compress, numel = parse_compress(spec), 61706
    client = _client(numel, servers, compress)
    shards = [client.cuts[i + 1] - client.cuts[i] for i in range(servers)]
    client.send_gradients(torch.randn(numel), 2, lambda i: msg.header(msg.PUSH))
    assert client.sent == ps_push_bytes(shards, compress)
    assert client.push_bytes == ps_push_bytes(shards) == 4 * numel + 32 * servers  # test_ps.py's count
    # and a server counts each push of its shard as the payload the formula prices
    for i, n in enumerate(shards):
        assert msg.HEADER_BYTES + Inbox(compress, n, i, 2).nbytes == ps_push_bytes([n], compress)


def test_ps_sync_server_sends_what_the_formula_prices():
    server = SimpleNamespace(links=SimpleNamespace(send=lambda w, t: _Done(), peers={0: None, 1: None, 2: None}),
                             log=SimpleNamespace(bytes_sent=0))
    SyncServer._send_all(server, torch.zeros(101))
    assert server.log.bytes_sent == ps_server_bytes(101, 0, 3)[1] == 3 * ps_pull_bytes([101])
