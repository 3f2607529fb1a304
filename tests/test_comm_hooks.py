"""The compressed DDP hooks (comm/hooks.py, built by comm/setup.compression) on 2 gloo ranks in-process:
fp16 is the exact mean up to its precision, top-k's error feedback loses nothing, and each hook reports
the bytes it really puts on the wire. (The codecs alone: test_comm_compress.py.)"""

import math

import pytest
import torch

from multirank import group

WORLD = 2


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(30, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 5))


def _batch(rank, step=0):
    gen = torch.Generator().manual_seed(100 * step + rank)  # each rank its own batch
    return torch.randn(16, 30, generator=gen), torch.randint(0, 5, (16,), generator=gen)


def _compressed(rank, world, spec, steps):
    """`steps` backward passes of the same batch through DDP with --compress SPEC's hook, no update in between;
    per step the gradients it left and the bytes it noted per bucket; the local gradient and the residuals."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from scaletrain.comm.hooks import compressed_hook
    from scaletrain.comm.setup import compression

    buckets, noted = [], []

    class Recorder:
        def note_wire(self, nbytes):
            noted.append(nbytes)

    def hook(state, bucket):  # the hook as DDP calls it, seen from outside: the bucket's size
        buckets.append(bucket.buffer().numel())
        return compressed_hook(state, bucket)

    x, y = _batch(rank)
    local = _model()
    torch.nn.functional.cross_entropy(local(x), y).backward()
    with group():
        model = _model()
        ddp = DDP(model, bucket_cap_mb=0.01)
        setup = compression(spec, seed=rank, model=model)
        assert setup.hook is compressed_hook
        setup.state.recorder = Recorder()
        ddp.register_comm_hook(setup.state, hook)
        per_step = []
        for _ in range(steps):
            ddp.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            per_step.append({"grads": [p.grad.clone() for p in model.parameters()],
                             "buckets": list(buckets), "noted": list(noted)})
            buckets.clear()
            noted.clear()
        residuals = getattr(setup.state.compressor, "feedback", None)
        return {"steps": per_step, "local": [p.grad.clone() for p in local.parameters()],
                "residuals": dict(residuals.residuals) if residuals else None}


def _mean_local(results):
    return [sum(r["local"][i] for r in results) / len(results) for i in range(len(results[0]["local"]))]


def test_fp16_gives_the_mean_within_half_precision_and_sends_half_the_bytes(ranks):
    results = ranks.run(_compressed, WORLD, "fp16", 2)
    exact = _mean_local(results)
    numel = sum(g.numel() for g in exact)
    for r in results:
        for step in r["steps"]:
            for got, want in zip(step["grads"], exact):
                torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-4)
            assert all(got.dtype == torch.float32 for got in step["grads"])  # decoded into the bucket's dtype
            # an all-reduce of 2-byte values: 2 (P-1)/P x 2 bytes per gradient, half of fp32's
            assert sum(step["buckets"]) == numel
            assert step["noted"] == [2 * (WORLD - 1) * 2 * n // WORLD for n in step["buckets"]]
            assert sum(step["noted"]) == 2 * numel
    assert any(not torch.equal(got, want) for got, want in zip(results[0]["steps"][0]["grads"], exact)), \
        "fp16 gave the exact fp32 mean: the cast did not happen"
    for a, b in zip(results[0]["steps"][-1]["grads"], results[1]["steps"][-1]["grads"]):
        assert torch.equal(a, b)  # every rank decodes the same sum


def test_topk_with_error_feedback_delays_but_never_loses_gradient(ranks):
    steps, ratio = 5, 0.1
    results = ranks.run(_compressed, WORLD, f"topk:{ratio}", steps)
    exact = _mean_local(results)
    numel = sum(g.numel() for g in exact)
    for r in results:
        for step in r["steps"]:
            # an all-gather of k fp32 values and k int32 indices per bucket: (P-1) x 8 k bytes
            assert sum(step["buckets"]) == numel
            assert step["noted"] == [(WORLD - 1) * 8 * math.ceil(ratio * n) for n in step["buckets"]]
            assert sum(step["noted"]) < 0.25 * 4 * numel  # far less than the fp32 gradient
        assert set(r["residuals"]) == set(range(len(exact)))  # kept per parameter, by its index
    for i, want in enumerate(exact):
        sent = sum(step["grads"][i] for step in results[0]["steps"])
        kept = sum(r["residuals"][i].view_as(want) for r in results) / WORLD
        # what was applied plus what is still held back is every step's full mean gradient
        torch.testing.assert_close(sent + kept, steps * want, rtol=1e-4, atol=1e-5)
        for r in results[1:]:
            assert all(torch.equal(a["grads"][i], b["grads"][i]) for a, b in zip(results[0]["steps"], r["steps"]))
    first = results[0]["steps"][0]["grads"]
    assert sum(int((g != 0).sum()) for g in first) <= WORLD * sum(math.ceil(ratio * n)
                                                                  for n in results[0]["steps"][0]["buckets"])
    assert any(float(r.abs().max()) > 0 for r in results[0]["residuals"].values())


@pytest.mark.parametrize("spec, per_value", [("bf16", 2), ("qsgd:127", 1)])
def test_other_codecs_report_their_wire_bytes_and_keep_the_ranks_equal(ranks, spec, per_value):
    results = ranks.run(_compressed, WORLD, spec, 1)
    exact = _mean_local(results)
    step = results[0]["steps"][0]
    if spec == "bf16":  # linear: all-reduced
        assert step["noted"] == [2 * (WORLD - 1) * per_value * n // WORLD for n in step["buckets"]]
    else:  # int8 levels and one fp32 norm per bucket, all-gathered
        assert step["noted"] == [(WORLD - 1) * (per_value * n + 4) for n in step["buckets"]]
    for a, b in zip(results[0]["steps"][0]["grads"], results[1]["steps"][0]["grads"]):
        assert torch.equal(a, b)
    cos = torch.nn.functional.cosine_similarity(torch.cat([g.flatten() for g in step["grads"]]),
                                                torch.cat([g.flatten() for g in exact]), dim=0)
    assert cos > 0.9  # an unbiased or rounded mean points where the exact one does
