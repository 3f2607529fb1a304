"""A strategy written for tests/test_predict_seam.py alone: one module and one registry line, priced by
`predict` through Strategy.cost without predict/ knowing its name. It all-reduces the gradients once,
flat, after backward (no overlap), and keeps no bucket copy."""

from __future__ import annotations

from scaletrain.comm.strategy import Strategy
from scaletrain.perf import alphabeta


class FlatAfterBackward(Strategy):
    @classmethod
    def cost(cls, pricing):
        from scaletrain.predict.pricing import Cost

        alpha, beta = pricing.link("allreduce")
        grads = sum(pricing.grads)
        seconds = alphabeta.predict(alpha, beta, pricing.setting.trainers, grads)
        return Cost(seconds, {"bytes_per_step": grads, "buckets": 1, "comm_total_s": seconds, "comm_hidden_s": 0.0,
                              "overlap_ratio": 0.0}, extra={"flat": {"bytes": grads}})
