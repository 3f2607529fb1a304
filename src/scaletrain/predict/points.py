"""From run settings to predicted points: trace the model, price its ops with the calibration, apply the
model (model.py) and name each point's limit and the scaling's (docs/predict.md)."""

from __future__ import annotations

import functools
import math
import statistics
from typing import Any

import numpy as np

from scaletrain.errors import UserError
from scaletrain.predict import model as M
from scaletrain.predict.calibration import nearest_threads
from scaletrain.predict.kinds import GROUP
from scaletrain.predict.ops import Workload
from scaletrain.predict.regress import LayerTimes

LARGE_BATCH = 256  # the batch a device's per-sample efficiency is judged against
GROUP_BOUND = 2.0  # a group's loop factor stays within this ratio of the pooled factor (Predictor._group_factors)
_LAWS: dict[tuple, LayerTimes] = {}


class Predictor:
    """Everything one calibration (or hardware profile) predicts with, cached per precision and threads."""

    def __init__(self, calibration: dict[str, Any], network: dict[str, Any], hardware=None,
                 probe: dict[str, Any] | None = None) -> None:
        self.cal, self.network, self.hardware = calibration, network, hardware
        self.probe = probe  # probe.speed_now()'s result, or None
        self._times: dict[tuple[str, int], LayerTimes] = {}
        self._loops: dict[int, M.Loop] = {}
        self.notes: list[str] = []

    # ---------------------------------------------------------------- calibrated laws
    def times(self, precision: str, threads: int) -> LayerTimes:
        t = nearest_threads(self.cal, threads)
        key = (precision, t)
        if key not in self._times:
            if precision not in self.cal["precisions"]:
                raise UserError(f"the calibration has no {precision} measurements (it has "
                                f"{', '.join(self.cal['precisions'])}): calibrate without --quick, or predict "
                                f"--precision {self.cal['precisions'][0]}")
            cache = (self.cal.get("created"), self.cal["device"].get("name"), len(self.cal["layers"]), precision, t)
            if cache not in _LAWS:  # fitting takes seconds: once per calibration, precision and thread count
                rows = [r for r in self.cal["layers"] if r["precision"] == precision and r["threads"] == t]
                _LAWS[cache] = LayerTimes(rows)
            self._times[key] = _LAWS[cache]
        return self._times[key]

    def regression_errors(self) -> dict[str, Any]:
        out = {}
        for (prec, t), lt in sorted(self._times.items()):
            for name, e in lt.errors().items():
                out[f"{name}/{prec}/t{t}"] = e
        return out

    def optimizer_law(self, name: str, threads: int, now: bool = True):
        t = nearest_threads(self.cal, threads)
        k = self.speed(threads) if now else 1.0
        rows = [r for r in self.cal["optimizer"] if r["optimizer"] == name and r["threads"] == t] or \
            [r for r in self.cal["optimizer"] if r["optimizer"] == "sgd" and r["threads"] == t]
        a = np.array([[1.0, r["tensors"], r["numel"]] for r in rows])
        y = np.array([r["seconds"] for r in rows])
        from scipy.optimize import nnls

        coef, _ = nnls(a, y)
        return lambda tensors, numel: k * float(coef[0] + coef[1] * tensors + coef[2] * numel)

    def loader_sample_s(self, dataset: str, image_size: int, source_pixels: int | None, batch: int = 32) -> float:
        """Loader seconds per sample (read, decode, transform, collate, and its share of the batch's own cost)."""
        fit = self.cal["loader"]["fit"]
        kind = dataset.split(":", 1)[0]
        a, b, c, *d = fit.get(kind, fit.get("synthetic", [0.0, 0.0, 0.0]))
        return a + b * (source_pixels or image_size * image_size) + c * image_size * image_size + \
            (d[0] / max(1, batch) if d else 0.0)

    def worker_interference(self) -> float | None:
        """Seconds a busy loader worker adds to the step's compute per second of its own work, when the
        rank's threads already fill the cores: the calibration's reference run with one worker on a JPEG
        folder against the same run without (None when the calibration has no such run)."""
        runs = [r for r in self.cal["loop"]["runs"] if "error" not in r and r.get("phases_mean_s")
                and r["nproc"] == 1 and r.get("model", "refnet") == "refnet"]
        busy = [r for r in runs if r.get("workers")]
        idle = [r for r in runs if not r.get("workers")]
        if not busy or not idle:
            return None
        keys = ("forward", "backward", "optimizer", "other")
        extra = sum(busy[0]["phases_mean_s"][k] - idle[0]["phases_mean_s"][k] for k in keys)
        loader = busy[0]["batch_size"] * self.loader_sample_s("imagefolder", self.cal["loop"]["image_size"],
                                                              busy[0].get("source_pixels"), busy[0]["batch_size"])
        return max(0.0, extra / loader) if loader > 0 else None

    def handoff(self, image_size: int, sample_s_64: float) -> tuple[float, float]:
        """(seconds per batch a worker adds handing a batch over, first-batch start-up seconds) per sample
        of the calibrated 64-pixel folder: start-up scaled to this batch later."""
        rows = self.cal["loader"]["workers"]
        if not rows:
            return 0.0, 0.0
        r1 = next((r for r in rows if r["workers"] == 1), rows[0])
        handoff = max(0.0, r1["per_batch_s"] - r1["batch_size"] * sample_s_64)
        startup = max(0.0, statistics.fmean(r["first_batch_s"] for r in rows) - r1["batch_size"] * sample_s_64)
        return handoff, startup

    def loop(self, local_ranks: int) -> M.Loop:
        """What the training loop adds, from the calibration's reference runs (docs/predict.md).

        Forward and backward on one rank: each reference network's measured phase against its ops'
        calibrated sums, split by group (kinds.GROUP), fitted (non-negative least squares over the
        networks) to one factor for compute-bound and one for memory-bound ops: what a real step adds to
        isolated ops (the loop and profiler, caches colder than for an op repeated alone). With one network
        only, one factor for both. More ranks per node: both factors scaled by how much slower the mixed
        reference network ran there than they predict from its ops timed at that many threads (ranks
        sharing the memory bus and caches). Every run is corrected by the speed probe for a change of the
        machine's speed between the op grid and the runs. `optimizer` gains what the run's optimizer
        phase took beyond its law; `h2d` and `other` are the run's. On several ranks, the exposed
        communication the bucket model does not explain is added: a constant and a share of the step's
        compute when the calibration ran two batch sizes on that many ranks (ranks drift out of step in
        proportion to their work), a constant otherwise."""
        batch = self.cal["loop"]["batch_size"]
        runs: dict[int, list[dict[str, Any]]] = {}
        for r in self.cal["loop"]["runs"]:
            if "error" not in r and r.get("phases_mean_s") and not r.get("workers"):
                runs.setdefault(r["nproc"], []).append(r)
        if not runs:
            self.notes.append("the calibration has no training-loop run: forward and backward are the ops' sums")
            return M.Loop()
        nproc = min(runs, key=lambda n: (abs(math.log(n / max(1, local_ranks))), -n))
        if nproc not in self._loops:
            base = self._group_factors(runs[min(runs)])
            main = min((r for r in runs[nproc] if r.get("model", "refnet") == "refnet"),
                       key=lambda r: abs(r.get("batch_size", batch) - batch), default=runs[nproc][0])
            mine = self._reference(main)
            ph = main["phases_mean_s"]
            scale = {"forward": 1.0, "backward": 1.0}
            if nproc != min(runs):
                for d in scale:
                    predicted = base[d][0] * mine[d]["compute"] + base[d][1] * mine[d]["memory"]
                    scale[d] = ph[d] * mine["drift"] / predicted if predicted else 1.0
            loop = M.Loop(forward=base["forward"][0] * scale["forward"],
                          backward=base["backward"][0] * scale["backward"],
                          forward_memory=base["forward"][1] * scale["forward"],
                          backward_memory=base["backward"][1] * scale["backward"],
                          optimizer_s=max(0.0, ph["optimizer"] - mine["optimizer_law_s"]), h2d_s=ph["h2d"],
                          other_s=ph["other"])
            if nproc > 1:
                points = [(r["phases_mean_s"]["forward"] + r["phases_mean_s"]["backward"],
                           max(0.0, r["phases_mean_s"]["comm_exposed"] - self._plain_comm(r)))
                          for r in runs[nproc] if r.get("model", "refnet") == "refnet"]
                loop.comm_s, loop.comm_per_compute = _affine(points)
            self._loops[nproc] = loop
        return self._loops[nproc]

    def _group_factors(self, runs: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
        """{direction: (compute factor, memory factor)} from the one-rank runs of the reference networks."""
        from scipy.optimize import nnls

        refs = [(self._reference(r), r["phases_mean_s"]) for r in runs]
        out = {}
        for d in ("forward", "backward"):
            a = np.array([[ref[d]["compute"], ref[d]["memory"]] for ref, _ in refs])
            y = np.array([ph[d] * ref["drift"] for ref, ph in refs])
            single = float(y.sum() / a.sum()) if a.sum() > 0 else 1.0
            if len({r.get("model", "refnet") for r in runs}) < 2:
                out[d] = (single, single)
                continue
            coef, _ = nnls(a, y)
            # three noisy runs can pull the fit far (a memory factor of 6 when one run ran slow): each
            # group's factor is held within GROUP_BOUND of the pooled one
            lo, hi = single / GROUP_BOUND, single * GROUP_BOUND
            out[d] = tuple(float(min(hi, max(lo, c))) for c in coef) if min(coef) > 0 else (single, single)
        return out

    def _loop_drift(self, threads: int) -> float:
        """The probe along the op grid over the probe around the loop runs (1 without probes): a loop run
        on a machine running 10% slower than during the grid has its factor taken down by that."""
        pr = self.cal.get("probe") or {}
        t = str(nearest_threads(self.cal, threads))
        grid, loop = (pr.get("mean_s") or {}).get(t), (pr.get("loop_mean_s") or {}).get(t)
        return grid / loop if grid and loop else 1.0

    def _plain_comm(self, run: dict[str, Any]) -> float:
        """The exposed communication the bucket model alone gives the reference run."""
        ref = self._reference(run)
        s = M.Setting(batch_size=run.get("batch_size", self.cal["loop"]["batch_size"]), nproc=run["nproc"],
                      cores=self.cal["device"]["cores"], threads=ref["threads"])
        return M.predict_step(ref["ops"], s, M.Loop(), self.network, lambda t, n: 0.0)["phases_s"]["comm_exposed"]

    def _reference(self, run: dict[str, Any]) -> dict[str, Any]:
        """A reference run's ops (calibrated, as when measured: their shapes are in the grid), their sums per
        direction and group (the loss with the memory-bound ops), the optimizer's law and the probe drift."""
        cal = self.cal["loop"]
        batch = run.get("batch_size", cal["batch_size"])
        ref = _reference_workload(run.get("model", "refnet"), cal["image_size"], batch)
        threads = run.get("threads") or 1
        ops = self.op_costs(ref, "fp32", threads, now=False)
        loss = self.loss_s(batch, 10, "fp32", threads, now=False)
        sums = {}
        for i, d in enumerate(("forward", "backward")):
            compute = sum(getattr(o, f"{d}_s") for o in ops if o.group == "compute")
            sums[d] = {"compute": compute, "memory": sum(getattr(o, f"{d}_s") for o in ops) - compute + loss[i]}
        grads = [g for o in ops for g in o.grad_bytes]
        return {**sums, "ops": ops, "threads": threads, "drift": self._loop_drift(threads),
                "optimizer_law_s": self.optimizer_law("sgd", threads, now=False)(len(grads), sum(grads) // 4)}

    # ---------------------------------------------------------------- pricing ops
    def speed(self, threads: int) -> float:
        """The speed probe's ratio (now / when calibrated) at the calibrated thread count nearest `threads`
        (1 without a probe): what the calibrated compute times are scaled by."""
        rows = (self.probe or {}).get("threads") or {}
        if not (self.probe or {}).get("applied") or not rows:
            return 1.0
        t = nearest_threads(self.cal, threads)
        return rows.get(str(t), {}).get("ratio", 1.0)

    def op_costs(self, workload: Workload, precision: str, threads: int, now: bool = True) -> list[M.OpCost]:
        if self.hardware is not None:
            return self._roofline_costs(workload, precision)
        lt = self.times(precision, threads)
        k = self.speed(threads) if now else 1.0
        costs = []
        for op in workload.ops:
            grads = [4 * n for n in op.param_numels]
            if op.kind == "view":
                costs.append(M.OpCost(0.0, 0.0, grads, "none", "memory"))
                continue
            fwd, bwd, source = lt.times(op.kind, op.features)
            costs.append(M.OpCost(k * fwd, k * bwd, grads, source, GROUP[op.kind]))
        return costs

    def _roofline_costs(self, workload: Workload, precision: str) -> list[M.OpCost]:
        from scaletrain.perf.hardware import roofline_time

        hw = self.hardware
        costs = []
        for op in workload.ops:
            grads = [4 * n for n in op.param_numels]
            moved = 2 * op.out_bytes + sum(grads)
            fwd = roofline_time(op.flops, moved, hw, precision) if op.kind != "view" else 0.0
            bwd = roofline_time(2 * op.flops, 2 * moved, hw, precision, kernels=2) if op.kind != "view" else 0.0
            costs.append(M.OpCost(fwd, bwd, grads, "roofline", GROUP.get(op.kind, "memory")))
        return costs

    def loss_s(self, batch: int, classes: int, precision: str, threads: int, now: bool = True) -> tuple[float, float]:
        if self.hardware is not None:
            return 0.0, 0.0
        lt = self.times(precision, threads)
        f, b, _ = lt.times("eltwise", {"elements": batch * classes, "inputs": 1})
        k = self.speed(threads) if now else 1.0
        return 3 * k * f, 3 * k * b  # log-softmax, gather, mean: about three element-wise passes each way


@functools.lru_cache(maxsize=64)
def _cached_workload(model_name: str, num_classes: int, in_channels: int, image_size: int, batch: int, stem: str,
                     width: float) -> Workload:
    import torch

    from scaletrain.models.registry import build_model

    with torch.device("cpu"):
        m = build_model(model_name, num_classes=num_classes, in_channels=in_channels, image_size=image_size,
                        stem=stem, width=width)
    return cal_workload(m, (in_channels, image_size, image_size), batch)


@functools.lru_cache(maxsize=16)
def _reference_workload(name: str, image_size: int, batch: int) -> Workload:
    from scaletrain.predict import refnet

    return cal_workload(refnet.factory(name)(10, 3, image_size), (3, image_size, image_size), batch)


def cal_workload(module, input_shape, batch: int) -> Workload:
    from scaletrain.predict.ops import trace_ops

    return trace_ops(module, tuple(input_shape), batch)


def workload(cfg, data_facts: dict[str, Any], batch: int) -> Workload:
    return _cached_workload(cfg.model, data_facts["classes"], data_facts["channels"], data_facts["image_size"],
                            batch, cfg.stem, cfg.width)


@functools.lru_cache(maxsize=32)
def data_facts(dataset: str, image_size: int | None, synthetic_samples: int, synthetic_classes: int) -> dict[str, Any]:
    """Samples, classes, channels, image size and (image folders) the images' mean source pixels."""
    from scaletrain.data.registry import build_datasets

    bundle = build_datasets(dataset, image_size=image_size, synthetic_samples=synthetic_samples,
                            synthetic_classes=synthetic_classes)
    facts = {"samples": len(bundle.train), "classes": bundle.num_classes, "channels": bundle.in_channels,
             "image_size": bundle.image_size, "source_pixels": None}
    if dataset.startswith("imagefolder:"):
        from PIL import Image

        train = bundle.train
        picks = range(0, len(train), max(1, len(train) // 16))
        sizes = []
        for i in picks:
            with Image.open(train.path(i)) as im:
                sizes.append(im.size[0] * im.size[1])
        facts["source_pixels"] = int(statistics.fmean(sizes)) if sizes else None
    return facts


def predict_config(p: Predictor, cfg, *, shared_cores: int | None = None, cores: int | None = None) -> dict[str, Any]:
    """One point: the model's phases, epoch, memory and limit for a TrainConfig (its batch per rank)."""
    from scaletrain.comm.spec import parse_compress

    facts = data_facts(cfg.dataset, cfg.image_size, cfg.synthetic_samples, cfg.synthetic_classes)
    cores = cores or (p.hardware.cpu_cores if p.hardware and p.hardware.cpu_cores else p.cal["device"]["cores"])
    s = M.Setting(batch_size=cfg.batch_size, precision=cfg.precision, nproc=cfg.nproc, nnodes=cfg.nnodes,
                  workers=cfg.workers, strategy=cfg.strategy, compress=parse_compress(cfg.compress),
                  ps_servers=cfg.ps_servers, bucket_cap_mb=cfg.bucket_cap_mb, optimizer=cfg.optimizer, cores=cores,
                  shared_cores=shared_cores, threads=cfg.threads, train_samples=facts["samples"],
                  stages=(cfg.stages or cfg.nproc * cfg.nnodes) if cfg.strategy == "pipeline" else 1)
    if s.trainers < 1:
        raise UserError(f"--nproc {cfg.nproc} x --nnodes {cfg.nnodes} leaves no worker beside {s.servers} server(s)")
    w = workload(cfg, facts, cfg.batch_size)
    threads = s.rank_threads
    ops = p.op_costs(w, cfg.precision, threads)
    loss = p.loss_s(cfg.batch_size, facts["classes"], cfg.precision, threads)
    s.sample_s = p.loader_sample_s(cfg.dataset, facts["image_size"], facts["source_pixels"], cfg.batch_size)
    s.worker_interference = p.worker_interference() if not p.hardware else None
    handoff, startup = p.handoff(facts["image_size"], p.loader_sample_s("imagefolder", 64, 64 * 64))
    loop = p.loop(cfg.nproc)
    opt_law = p.optimizer_law(cfg.optimizer, threads)
    step = M.predict_step(ops, s, loop, p.network, opt_law, loss, loader_first_batch_s=startup + s.sample_s *
                          cfg.batch_size, handoff_s=handoff if cfg.workers else 0.0)
    split = _split_model(p, cfg, s, w, facts, threads, opt_law, loop, step)
    steps = facts["samples"] // (cfg.batch_size * s.trainers)
    act = sum(op.out_bytes for op in w.ops if op.saves_activation)
    if cfg.precision != "fp32":
        act = int(act * 0.75)  # autocast keeps conv and linear outputs in 16 bits, the rest in fp32
    sample_bytes = 4 * facts["channels"] * facts["image_size"] ** 2
    baseline = (p.cal.get("memory") or {}).get("baseline_rss_bytes") or 0
    mem = M.memory(s, w.params, act, sample_bytes * cfg.batch_size, 0)
    if s.strategy == "fsdp":  # parameters, gradients and optimizer state in 1/N shards, plus one unit gathered
        world = s.world
        for key in ("parameters", "gradients", "optimizer"):
            mem[key] = mem[key] // world
        mem["buckets"] = max(split["units"]) if split else 0
    elif split:  # the largest stage's memory, as split/partition.py counts it
        peak = max(split["split"]["stages"], key=lambda st: st["memory_bytes"])
        mem.update({"parameters": 0, "gradients": 0, "optimizer": 0, "activations": 0, "buckets": 0,
                    "stage": peak["memory_bytes"]})
    if baseline and not p.hardware:
        ref = _refnet_memory(p)
        mem["baseline"] = max(0, baseline - ref)
    eff = batch_efficiency(p, cfg, facts, ops, threads)
    lim, note = M.limit(step["phases_s"], eff)
    per_op = [{"name": op.name, "kind": op.kind, "source": c.source, "forward_s": c.forward_s,
               "backward_s": c.backward_s} for op, c in zip(w.ops, ops) if op.kind != "view"]
    sources = {}
    for o in ops:
        if o.source != "none":
            sources[o.source] = sources.get(o.source, 0) + 1
    return {"setting": s, "phases_s": step["phases_s"], "step_time_s": step["step_time_s"],
            "steps_per_epoch": steps, "epoch_time_s": steps * step["step_time_s"] + step["epoch_start_s"],
            "samples_per_s": cfg.batch_size * s.trainers / step["step_time_s"],
            "peak_memory_bytes": sum(mem.values()), "memory_bytes": mem, "memory_kind":
            ("cuda" if p.cal["device"]["type"] == "cuda" else "rss") if not p.hardware else p.hardware.kind,
            "comm": step["comm"], "layers": {k: sources.get(k, 0) for k in ("measured", "regression", "roofline")},
            "limit": lim, "limit_note": note, "batch_efficiency": eff, "threads": threads,
            "stretch": step["stretch"], "notes": list(w.notes), "image_size": facts["image_size"], "ops": per_op,
            **({"pipeline": {k: v for k, v in split.items() if k != "units"}} if split and "split" in split else {})}


def _split_model(p: Predictor, cfg, s: M.Setting, w: Workload, facts: dict[str, Any], threads: int, opt_law,
                 loop: M.Loop, step: dict[str, Any]) -> dict[str, Any] | None:
    """A pipeline's or FSDP's phases in place of data parallelism's (predict/pipeline.py); `step` is changed."""
    from scaletrain.predict import pipeline as PP

    if not s.splits_model:
        return None
    alpha, beta = M.link(s, p.network, "allreduce")
    phases = step["phases_s"]
    if s.strategy == "fsdp":
        units = PP.fsdp_units(cfg.model, facts, cfg.stem, cfg.width)
        f, b = PP.fsdp_comm_s(units, s.world, alpha, beta)
        phases["forward"] += f
        phases["backward"] += b
        step["comm"] = {"bytes_per_step": int(1.5 * sum(units) * 2 * (s.world - 1) / s.world), "buckets": len(units),
                        "comm_total_s": f + b, "comm_hidden_s": 0.0, "overlap_ratio": 0.0 if s.world > 1 else None}
        step["step_time_s"] = sum(phases.values())
        return {"units": units}
    PP.check_basis(p.hardware)
    pp = PP.pipeline_phases(p.cal, cfg, facts, threads, p.network, (alpha, beta))
    k = len(pp["stage_param_bytes"])
    mean_params = sum(pp["stage_param_bytes"]) / k
    tensors = max(1, sum(len(o.param_numels) for o in w.ops) // k)
    phases["forward"], phases["backward"] = pp["forward"], pp["backward"]
    phases["optimizer"] = opt_law(tensors, int(mean_params // 4)) + loop.optimizer_s
    phases["comm_exposed"] = PP.replicas_allreduce_s(pp["stage_param_bytes"], s.trainers, alpha, beta)
    ordered = {}
    for name in ("data_wait", "h2d", "forward", "backward", "comm_exposed", "optimizer"):
        ordered[name] = phases[name]
    ordered |= {"bubble": pp["bubble"], "p2p": pp["p2p"], "other": phases["other"]}
    step["phases_s"] = ordered
    transfers = sum(st["transfer_s"] for st in pp["split"]["stages"]) * cfg.microbatches
    step["comm"] = {"bytes_per_step": 0, "buckets": 0, "comm_total_s": transfers + ordered["comm_exposed"],
                    "comm_hidden_s": 0.0, "overlap_ratio": None}
    step["step_time_s"] = sum(ordered.values())
    return pp


def _refnet_memory(p: Predictor) -> int:
    from scaletrain.predict import refnet

    cal = p.cal["loop"]
    w = cal_workload(refnet.build(10, 3, cal["image_size"]), (3, cal["image_size"], cal["image_size"]),
                     cal["batch_size"])
    act = sum(op.out_bytes for op in w.ops if op.saves_activation)
    s = M.Setting(batch_size=cal["batch_size"])
    return sum(M.memory(s, w.params, act, 4 * 3 * cal["image_size"] ** 2 * cal["batch_size"]).values())


def _affine(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(constant, slope) of y over x through the (x, y) points, neither negative; one point: a constant."""
    if len(points) < 2 or max(x for x, _ in points) - min(x for x, _ in points) <= 0:
        return statistics.fmean(y for _, y in points), 0.0
    (x0, y0), (x1, y1) = min(points), max(points)
    slope = max(0.0, (y1 - y0) / (x1 - x0))
    const = max(0.0, statistics.fmean(y - slope * x for x, y in points))
    return const, slope


def batch_efficiency(p: Predictor, cfg, facts, ops: list[M.OpCost], threads: int) -> float:
    """Per-sample compute at this batch against at LARGE_BATCH (1 = the batch is large enough)."""
    if cfg.batch_size >= LARGE_BATCH:
        return 1.0
    big = workload(cfg, facts, LARGE_BATCH)
    big_ops = p.op_costs(big, cfg.precision, threads)
    small = sum(o.forward_s + o.backward_s for o in ops) / cfg.batch_size
    large = sum(o.forward_s + o.backward_s for o in big_ops) / LARGE_BATCH
    return min(1.0, large / small) if small > 0 else 1.0
