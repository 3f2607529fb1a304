"""Price every candidate through predict's one cost seam, keep those within the memory budget, rank them by
time to train (docs/plan.md). Computation only: present.py shows the result."""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
from collections import Counter
from typing import Any, Callable

import scaletrain
from scaletrain.errors import UserError
from scaletrain.comm.memory import MARGIN, within
from scaletrain.plan.certainty import BAND, caveat, uncertain
from scaletrain.plan.space import Request, grid_name, grids, left_out, train_settings

LINEAR_SCALING_BASE = 256  # Goyal et al. 2017: lr = 0.1 x global batch / 256, warm-up over 5 epochs


def search(req: Request, cal: dict[str, Any] | None, network: dict[str, Any], hw, basis: str, *,
           probe: dict[str, Any] | None = None, shapes=None,
           progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """plan.json's content: the request, every candidate priced or skipped (with why), the ones over the
    memory budget, and the rest ranked by predicted time to train `req.epochs` epochs."""
    from scaletrain.predict.cli import predict_spec
    from scaletrain.predict.scaling import make_predictor, predict_grid

    device_kind = hw.kind if hw is not None else cal["device"]["type"]
    cores = req.cores_per_host or ((hw.cpu_cores or hw.count) if hw is not None else cal["device"]["cores"])
    precisions = None if hw is not None else tuple(cal["precisions"])
    budget = req.memory_budget or device_memory(cal, hw)
    space = grids(req, device_kind, cores, precisions, budget)
    total = sum(math.prod(len(v) for v in axes.values()) for axes in space)
    t0 = time.perf_counter()
    priced, skipped, pruned, notes, done = [], [], [], set(), 0
    predictor = make_predictor(cal, network, hw, probe, shapes=shapes)  # one for every grid: its fits and costs kept
    kind = "datasheet" if hw is not None else "calibration"
    bound = Bound(req, predictor, budget, BAND[kind])
    for axes in space:
        name = grid_name(axes)
        # predict_grid counts points within its grid (and op shapes timed, with no total): counted over the plan
        told = None if progress is None else (
            lambda what, i, n, at=done: progress(what, at + i, total) if n is not None else progress(what, i, n))
        try:
            spec = predict_spec(None, largest_batch_first(axes), train_settings(req, axes["strategy"][0]))
            prediction = predict_grid(spec, cal, network, hw, basis,
                                      global_batch=req.global_batch, probe=probe, shapes=shapes, progress=told,
                                      shared_cores=req.shared_cores, cores=req.cores_per_host, predictor=predictor,
                                      prune=bound.prune if req.priced_top else None, priced=bound.priced)
        except UserError as e:  # no candidate of this strategy combines: each one skipped with the reason
            skipped.append({"id": name, "axes": {"strategy": name}, "reason": str(e),
                            "candidates": math.prod(len(v) for v in axes.values())})
            continue
        finally:
            done += math.prod(len(v) for v in axes.values())
        for p in prediction["points"] + prediction["skipped"] + prediction["pruned"]:  # (one grid per strategy:
            p["id"] = f"{name}-{p['id']}"  # its name makes ids unique)
        priced += prediction["points"]
        skipped += prediction["skipped"]
        pruned += prediction["pruned"]
        notes.update(prediction["notes"])
    search_s = time.perf_counter() - t0
    fits, over = [], []
    for p in priced:
        if budget is None or p["peak_memory_bytes"] is None or within(p["peak_memory_bytes"], budget):
            fits.append(p)
        else:
            over.append({"id": p["id"], "axes": p["axes"], "peak_memory_bytes": p["peak_memory_bytes"]})
    ranked = sorted((_candidate(p, req) for p in fits), key=rank_key)
    for i, c in enumerate(ranked, 1):
        c["rank"] = i
    sure = uncertain(ranked, kind)
    return {"format": 1, "kind": "plan", "scaletrain_version": scaletrain.__version__,
            "request": dataclasses.asdict(req), "basis": kind,
            "basis_note": basis,
            "memory_budget_bytes": budget, "memory_margin": MARGIN, "grids": space,
            "not_searched": left_out(),
            "candidates": len(priced) + skipped_count(skipped) + len(pruned), "priced": len(priced),
            "search_s": search_s, "skipped": skipped, "skipped_why": reasons(skipped), "over_budget": over,
            "pruned": [p["id"] for p in pruned], "pruned_by": bound.describe(),
            "ranked": ranked, "chosen": ranked[0]["id"] if ranked else None, "uncertain": sure,
            "caveats": [line for line in (caveat(sure, kind),) if line] + caveats(ranked[:req.top]),
            "notes": sorted(notes)}


TIE = 0.005  # predicted times this close are one time to the model: the simpler configuration ranks first


def largest_batch_first(axes: dict[str, list]) -> dict[str, list]:
    """The grid priced largest batch first: the fastest candidates are usually there, and once `priced_top` are
    priced the bound prunes the rest (Bound); the order changes nothing else."""
    return {k: (sorted(v, reverse=True) if k == "batch_size" else v) for k, v in axes.items()}


class Bound:
    """Pruning by the model's own bound: a candidate whose whole-model forward and backward alone
    (predict/points.epoch_floor_s: what every strategy that runs the whole model on each trainer adds to, never
    takes from; a pipeline's, its blocks' compute over its stages) would train slower than the `req.priced_top`-th
    fastest candidate priced so far within the budget, nor within `band` of the fastest (certainty.BAND: those
    How sure counts), cannot be among those: it is not priced. Exact for the top candidates (the same ids and times
    as without); the plot and `ranked` hold the priced ones."""

    def __init__(self, req: Request, predictor, budget: int | None, band: float = 0.0) -> None:
        self.req, self.predictor, self.budget, self.band = req, predictor, budget, band
        self.times: list[float] = []  # times to train of the priced candidates within the budget, fastest first
        self.count = 0

    def priced(self, entry: dict[str, Any]) -> None:
        peak = entry["peak_memory_bytes"]
        if self.budget is None or peak is None or within(peak, self.budget):
            bisect.insort(self.times, entry["epoch_time_s"] * self.req.epochs)

    def prune(self, cfg) -> str | None:
        from scaletrain.predict.points import epoch_floor_s

        k = self.req.priced_top
        if not k or len(self.times) < k:
            return None
        floor = epoch_floor_s(self.predictor, cfg, shared_cores=self.req.shared_cores, cores=self.req.cores_per_host)
        kth = max(self.times[k - 1], self.times[0] * (1 + self.band))
        if floor is None or floor * self.req.epochs <= kth * (1 + 2 * TIE):  # (a tie may outrank by its levers)
            return None
        self.count += 1
        return (f"its forward and backward alone train in {floor * self.req.epochs:.4g} s, slower than the "
                f"{k} fastest priced and than the band of the fastest ({kth:.4g} s)")  # (a pipeline's: its blocks')

    def describe(self) -> str | None:
        if not self.req.priced_top:
            return None
        return (f"a candidate whose forward and backward alone (the whole model's; a pipeline's blocks' over its "
                f"stages) train slower than the {self.req.priced_top} fastest priced within the budget, and than "
                f"{100 * self.band:.0f}% over the fastest, is not priced (--no-prune prices every one)")


def rank_key(c: dict[str, Any]) -> tuple:
    """Time to train in steps of TIE (half a percent), then the fewer levers pulled (compression, activation
    checkpointing, loader workers: each costs something the model may not price), then less memory."""
    cfg = c["config"]
    levers = (cfg.get("compress", "none") != "none") + (cfg.get("checkpoint_activations", "none") != "none")
    return (math.floor(math.log(c["time_to_train_s"]) / math.log1p(TIE)) if c["time_to_train_s"] > 0 else 0,
            levers, cfg.get("workers", 0), c["peak_memory_bytes"] or 0, c["id"])


def device_memory(cal: dict[str, Any] | None, hw) -> int | None:
    """The basis's memory per device: the data sheet's, or the calibrated machine's (its RAM on a CPU)."""
    if hw is not None:
        return hw.memory_bytes
    return (cal or {}).get("device", {}).get("memory_bytes")


def _candidate(p: dict[str, Any], req: Request) -> dict[str, Any]:
    global_batch = p["config"]["batch_size"] * p["trainers"]
    return {"id": p["id"], "axes": p["axes"], "config": p["config"], "global_batch": global_batch,
            "time_to_train_s": p["epoch_time_s"] * req.epochs, "epoch_time_s": p["epoch_time_s"],
            "step_time_s": p["step_time_s"], "samples_per_s": p["samples_per_s"], "phases_s": p["phases_s"],
            "peak_memory_bytes": p["peak_memory_bytes"], "memory_bytes": p["memory_bytes"],
            "memory_kind": p["memory_kind"], "limit": p["limit"], "limit_note": p["limit_note"],
            "bucket_cap_mb": p["comm"].get("best_bucket_cap_mb"), "plausibility": p["plausibility"]["flag"]}


def skipped_count(skipped: list[dict[str, Any]]) -> int:
    """Candidates skipped: one each, or a whole strategy's grid (`candidates`) where none of it combines."""
    return sum(s.get("candidates", 1) for s in skipped)


def reasons(skipped: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The skipped candidates' reasons, each once with how many it skipped (most first)."""
    counts: Counter = Counter()
    for s in skipped:
        counts[s["reason"]] += s.get("candidates", 1)
    return [{"reason": r, "candidates": n} for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def caveats(top: list[dict[str, Any]]) -> list[str]:
    """What the ranking by time cannot say: a larger global batch changes the optimisation."""
    batches = sorted({c["global_batch"] for c in top})
    if len(batches) < 2:
        return []
    big = batches[-1]
    return [f"the top candidates train with global batches {', '.join(map(str, batches))}: a larger one takes "
            "fewer, larger steps and may need more epochs to reach the same accuracy; the linear scaling rule (Goyal "
            f"et al. 2017) would scale the learning rate by global batch / {LINEAR_SCALING_BASE} "
            f"(x{big / LINEAR_SCALING_BASE:g} at {big}) with a warm-up of about 5 epochs (--warmup-epochs); fix "
            "--global-batch to compare at one"]
