"""Compressors: round trips within their documented error, error feedback loses nothing, QSGD is unbiased."""

import math

import pytest
import torch

from scaletrain.comm.compress import (QSGD, Cast, Sign, TopK, make_compressor, pack_signs, payload_bytes,
                                      unpack_signs)
from scaletrain.comm.spec import check, parse_compress
from scaletrain.errors import UserError


def _grad(n=1000, seed=0):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def _one_rank(comp, grad, key=0):
    payload = comp.encode(grad, key, 1)
    return comp.decode(payload if comp.linear else [payload], grad.numel(), 1), payload


@pytest.mark.parametrize("dtype, rel", [(torch.float16, 1e-3), (torch.bfloat16, 8e-3)])
def test_cast_round_trip_within_the_formats_precision(dtype, rel):
    g = _grad()
    out, payload = _one_rank(Cast(dtype), g)
    assert payload[0].dtype == dtype and payload_bytes(payload) == 2 * g.numel()
    assert torch.allclose(out, g, rtol=rel, atol=1e-6)


def test_cast_divides_before_summing_so_the_sum_stays_in_range():
    big = torch.full((4,), 60000.0)  # fp16 max is 65504: 4 ranks' sum would overflow undivided
    parts = [Cast(torch.float16).encode(big, 0, 4)[0] for _ in range(4)]
    out = Cast(torch.float16).decode([sum(parts)], 4, 4)
    assert torch.isfinite(out).all() and torch.allclose(out, big, rtol=1e-3)


def test_topk_sends_the_largest_entries_and_keeps_the_rest():
    g = _grad()
    comp = TopK(0.01)
    out, (values, index) = _one_rank(comp, g)
    assert values.numel() == 10 and index.dtype == torch.int32
    assert set(index.tolist()) == set(g.abs().topk(10).indices.tolist())
    assert torch.equal(out + comp.feedback.residuals[0], g)  # sent + kept = the gradient, exactly


@pytest.mark.parametrize("make", [lambda: TopK(0.05), Sign])
def test_error_feedback_makes_the_accumulated_update_unbiased(make):
    comp, sent, total = make(), torch.zeros(500), torch.zeros(500)
    for step in range(50):
        g = _grad(500, seed=step)
        total += g
        sent += _one_rank(comp, g)[0]
    # whatever was not sent yet is in the residual: sent + residual == sum of gradients
    assert torch.allclose(sent + comp.feedback.residuals[0], total, atol=1e-4)
    assert (total - sent).norm() < 0.5 * total.norm()  # and most of it has been sent by now


def test_sign_packs_eight_signs_a_byte():
    positive = torch.rand(1001) > 0.5
    packed = pack_signs(positive)
    assert packed.numel() == 126 and packed.dtype == torch.uint8
    assert torch.equal(unpack_signs(packed, 1001), positive.float() * 2 - 1)
    comp = Sign()
    out, payload = _one_rank(comp, _grad(1001))
    assert payload_bytes(payload) == 126 + 4  # 32x smaller than fp32, plus one scale


def test_qsgd_is_unbiased_and_within_one_level():
    g = _grad(200)
    comp = QSGD(levels=4, seed=1)
    norm = g.norm()
    samples = torch.stack([_one_rank(comp, g)[0] for _ in range(2000)])
    assert (samples - g).abs().max() <= norm / 4 + 1e-5  # one quantisation level at most
    assert torch.allclose(samples.mean(0), g, atol=4 * (norm / 4).item() / math.sqrt(2000))


def test_qsgd_uses_int8_for_few_levels():
    payload = QSGD(levels=127).encode(_grad(), 0, 1)
    assert payload[0].dtype == torch.int8 and payload_bytes(payload) == 1000 + 4


def test_state_round_trips_through_a_checkpoint_dict():
    comp = TopK(0.1)
    comp.encode(_grad(), 3, 1)
    again = TopK(0.1)
    again.load_state_dict(comp.state_dict())
    assert torch.equal(again.feedback.residuals[3], comp.feedback.residuals[3])
    q = QSGD(8, seed=5)
    q.encode(_grad(), 0, 1)
    q2 = QSGD(8)
    q2.load_state_dict(q.state_dict())
    assert torch.equal(q.encode(_grad(), 0, 1)[0], q2.encode(_grad(), 0, 1)[0])  # same random stream


def test_specs_parse_and_bad_ones_are_one_line():
    assert parse_compress("topk:0.01") == ("topk", 0.01) and parse_compress("none") is None
    assert isinstance(make_compressor("bf16"), Cast) and make_compressor("powersgd:2") == ("powersgd", 2)
    for bad, msg in [("topk:0", "ratio"), ("qsgd:x", "cannot read"), ("zip", "unknown compressor"),
                     ("fp16:2", "takes no argument"), ("powersgd:0", "rank")]:
        with pytest.raises(UserError, match=msg):
            parse_compress(bad)
    with pytest.raises(UserError, match="--compress works with --strategy allreduce"):
        check("ring", "fp16")


def test_residuals_follow_parameters_when_buckets_are_regrouped():
    comp = TopK(0.2)
    g = _grad(5)
    comp.encode(g, ((0, 3), (1, 2)), 1)  # one bucket holding parameters 0 and 1
    kept = {pid: r.clone() for pid, r in comp.feedback.residuals.items()}
    alone = comp.feedback.add(torch.zeros(2), ((1, 2),))  # a later bucket holding parameter 1 alone
    assert torch.equal(alone, kept[1]) and kept[0].numel() == 3
