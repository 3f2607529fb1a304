"""The ring all-reduce (comm/ring.py) on real gloo ranks in-process: it sums exactly what `dist.all_reduce`
sums, sends the bytes it claims, and as a DDP hook gives DDP's own gradients. (The trainer with
`--strategy ring` is checked in test_strategies.py.)"""

import pytest
import torch

from multirank import group
from scaletrain.perf.wire import ring_bytes

SIZES = (1, 2, 5, 1001, 4099)  # fewer elements than ranks, and sizes the ranks do not divide


def _ring_and_engine(rank, world, sizes, own_groups):
    import torch.distributed as dist

    from scaletrain.comm.ring import ring_allreduce_

    with group():
        g, wrap = (dist.new_group(), dist.new_group()) if own_groups else (None, None)
        out = []
        for n in sizes:
            x = torch.randn(n, generator=torch.Generator().manual_seed(1000 * rank + n))
            engine = x.clone()
            dist.all_reduce(engine)
            sent = ring_allreduce_(x, g, wrap)
            out.append((x, engine, sent))
        return out


# 3 ranks on 2 cores: make test-slow; the 2-rank twins stay fast
@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize("own_groups", [False, True], ids=["default-group", "own-groups"])
def test_ring_allreduce_sums_like_all_reduce(ranks, world, own_groups):
    results = ranks.run(_ring_and_engine, world, SIZES, own_groups)
    for rank, per_size in enumerate(results):
        for n, (ring, engine, sent) in zip(SIZES, per_size):
            # the same sum up to the order of float additions
            torch.testing.assert_close(ring, engine, rtol=1e-6, atol=1e-6, msg=f"rank {rank}, {n} elements")
            assert sent == ring_bytes(n, 4, world, rank), (rank, n)
            # every rank ends with the very same bits: the all-gather copies the owner's chunk
            assert torch.equal(ring, results[0][SIZES.index(n)][0])
    expected = sum(torch.randn(4099, generator=torch.Generator().manual_seed(1000 * r + 4099)) for r in range(world))
    torch.testing.assert_close(results[0][-1][0], expected, rtol=1e-5, atol=1e-5)


class WireLog:
    """The profiler's recorder as a hook sees it: the bytes each bucket puts on the wire."""

    def __init__(self):
        self.noted = []

    def note_wire(self, nbytes):
        self.noted.append(nbytes)


def _ring_hook_and_plain_ddp(rank, world, steps):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from scaletrain.comm.ring import RingState, ring_hook

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                   torch.nn.Tanh(), torch.nn.Linear(64, 5))

    with group():
        plain = DDP(model(), bucket_cap_mb=0.01)  # several buckets, reduced while backward goes on
        ring = DDP(model(), bucket_cap_mb=0.01)
        log = WireLog()
        ring.register_comm_hook(RingState(group=dist.new_group(), wrap_group=dist.new_group(), recorder=log), ring_hook)
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, ring)]
        grads, noted = [], []
        for step in range(steps):
            gen = torch.Generator().manual_seed(100 * step + rank)  # each rank its own batch
            x, y = torch.randn(16, 20, generator=gen), torch.randint(0, 5, (16,), generator=gen)
            for m, opt in zip((plain, ring), opts):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(m(x), y).backward()
            grads.append([(p.grad.clone(), q.grad.clone()) for p, q in zip(plain.parameters(), ring.parameters())])
            noted.append(sum(log.noted))
            log.noted.clear()
            for opt in opts:
                opt.step()
        params = [(p.detach().clone(), q.detach().clone()) for p, q in zip(plain.parameters(), ring.parameters())]
        numel = sum(p.numel() for p in plain.parameters())
        return grads, params, noted, numel


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])  # 3 ranks: make test-slow
def test_the_ring_as_a_ddp_hook_gives_ddps_gradients(ranks, world):
    results = ranks.run(_ring_hook_and_plain_ddp, world, 3)
    for rank, (grads, params, noted, numel) in enumerate(results):
        for step in grads:
            for plain, ring in step:
                torch.testing.assert_close(ring, plain, rtol=1e-5, atol=1e-7)
        for plain, ring in params:  # and so, after 3 SGD steps, the same parameters
            torch.testing.assert_close(ring, plain, rtol=1e-5, atol=1e-7)
        # per step each rank sends about 2 (P-1)/P of the gradient bytes: exactly so with 2 ranks
        for sent in noted:
            if world == 2:
                assert sent == 4 * numel
            else:
                assert sent == pytest.approx(2 * (world - 1) / world * 4 * numel, rel=0.01)
    for rank in range(1, world):  # the replicas stay bit-identical
        for (_, a), (_, b) in zip(results[0][1], results[rank][1]):
            assert torch.equal(a, b)
