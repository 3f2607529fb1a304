"""The alpha-beta model: bandwidths as nccl-tests defines them, the fit, the prediction (perf/alphabeta.py)."""

import pytest

from scaletrain.perf.alphabeta import bandwidths, bus_factor, fit_alpha_beta, latency_steps, predict, with_model


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


def test_factors_for_an_all_reduce_and_a_parameter_server():
    assert [bus_factor(p) for p in (2, 4, 8)] == [1.0, 1.5, 1.75]
    assert [latency_steps(p) for p in (2, 4, 8)] == [2, 6, 14]
    assert [bus_factor(p, "ps") for p in (2, 4)] == [2, 6]  # the server's link carries P-1 pushes and pulls
    assert [latency_steps(p, "ps") for p in (2, 4)] == [2, 2]
    # t = 6 alpha + 1.5 S beta (ring of 4); t = 2 alpha + 6 S beta (server and 3 workers)
    assert predict(1e-5, 1e-9, 4, 1000) == pytest.approx(6e-5 + 1.5e-6)
    assert predict(1e-5, 1e-9, 4, 1000, "ps") == pytest.approx(2e-5 + 6e-6)
    _, busbw = bandwidths(1000, 1e-3, 4, "ps")
    assert busbw == pytest.approx(6e6)
    # a halo swap: one step, S bytes each way with a neighbour, whatever the ranks
    assert [(latency_steps(p, "halo"), bus_factor(p, "halo")) for p in (2, 4)] == [(1, 1), (1, 1)]
    assert predict(1e-3, 1e-9, 4, 1000, "halo") == pytest.approx(1e-3 + 1e-6)


def test_each_strategy_gets_its_own_fit():
    truth = {"ring": (50e-6, 1e-8), "ps": (200e-6, 4e-9)}
    rows = [{"world": p, "size": s, "strategy": k, "time_s": predict(*truth[k], p, s, k)}
            for k in truth for p in (2, 3, 4) for s in (1 << 10, 1 << 20, 1 << 24)]
    _, fits = with_model(rows)
    for k, (alpha, beta) in truth.items():
        assert fits[k]["alpha_s"] == pytest.approx(alpha, rel=1e-6)
        assert fits[k]["beta_s_per_byte"] == pytest.approx(beta, rel=1e-6)


def test_latency_only_times_fit_alpha_alone():
    rows = [{"world": 4, "size": s, "time_s": 6e-5, "strategy": "ring"} for s in (1 << 10, 1 << 20)]
    rows += [{"world": 2, "size": 1 << 24, "time_s": 1e-5, "strategy": "ring"}]  # faster at more bytes
    alpha, beta = fit_alpha_beta(rows)
    assert beta == 0.0 and alpha > 0
    out, fits = with_model(rows)
    assert fits["ring"]["link_bytes_per_s"] is None
