"""commbench's pure parts: sizes, bandwidths as nccl-tests defines them, the alpha-beta fit."""

import pytest

from scaletrain.commbench.model import bandwidths, fit_alpha_beta, parse_size, predict, with_model


def test_sizes_parse_to_float32_multiples():
    assert [parse_size(s) for s in ("1K", "64M", "4096", "1kb", "6")] == [1024, 64 << 20, 4096, 1024, 4]


def test_bus_bandwidth_scales_algorithm_bandwidth_by_2_p_minus_1_over_p():
    algbw, busbw = bandwidths(1 << 20, 0.001, 4)
    assert algbw == pytest.approx((1 << 20) / 0.001) and busbw == pytest.approx(algbw * 1.5)


def test_fit_recovers_alpha_and_beta_from_exact_times():
    alpha, beta = 50e-6, 1 / 1.25e8  # 50 us per step, 1 Gbit/s
    rows = [{"world": p, "size": s, "time_s": predict(alpha, beta, p, s), "strategy": "ring"}
            for p in (2, 3, 4) for s in (1024, 1 << 16, 1 << 20, 1 << 24)]
    fa, fb = fit_alpha_beta(rows)
    assert fa == pytest.approx(alpha, rel=1e-6) and fb == pytest.approx(beta, rel=1e-6)
    out, fits = with_model(rows)
    assert all(abs(r["error"]) < 1e-6 for r in out)
    assert fits["ring"]["link_bytes_per_s"] == pytest.approx(1.25e8)


def test_fit_never_returns_negative_latency():
    rows = [{"world": 2, "size": s, "time_s": s / 1e9, "strategy": "x"} for s in (1 << 10, 1 << 20, 1 << 24)]
    alpha, beta = fit_alpha_beta(rows)
    assert alpha >= 0 and beta > 0


def test_sizes_under_one_element_are_not_rounded_up():
    # the CLI refuses them; measuring 4 bytes for `--sizes 0` would answer another question
    assert [parse_size(s) for s in ("0", "3", "-1K")] == [0, 0, -1024]
    for bad in ("nan", "K", "big"):
        with pytest.raises(ValueError):
            parse_size(bad)
    with pytest.raises(OverflowError):
        parse_size("inf")
