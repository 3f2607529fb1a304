"""The calibrated laws one prediction prices with (docs/predict.md): per-op times per precision and thread
count, the optimizer's, the loop factors per group, the loader's and the speed probe's correction.

points.py predicts configurations with it; graph/ and split/ price a model's layers and blocks with it."""

from __future__ import annotations

import functools
import math
import statistics
from typing import Any

import numpy as np

from scaletrain.errors import UserError
from scaletrain.predict import model as M
from scaletrain.predict import workers as W
from scaletrain.predict.calibration import nearest_threads
from scaletrain.predict.kinds import GROUP
from scaletrain.predict.ops import Workload
from scaletrain.predict.regress import LayerTimes, work

LARGE_BATCH = 256  # the batch a device's per-sample efficiency is judged against
GROUP_BOUND = 2.0  # a group's loop factor stays within this ratio of the pooled factor (Predictor._group_factors)
_LAWS: dict[tuple, LayerTimes] = {}

CORRECTIONS = {
    "loop_factors": "forward and backward: the ops' isolated times x the loop factors fitted to the reference "
                    "runs (off: the ops' sums)",
    "group_factors": "one loop factor for compute-bound ops and one for memory-bound ops (off: one pooled factor)",
    "group_bound": f"each group's factor held within {GROUP_BOUND:g}x of the pooled one (off: as fitted)",
    "op_overhead": "each op in a step: + a constant and + its bytes fetched cold (up to its cores' L2) at a rate, "
                   "fitted with the factors over the one-rank reference runs at every batch and thread count (off: "
                   "the factors alone, over the runs at the most threads)",
    "rank_slowdown": "more ranks per node: the factors x how much slower the same network ran there than alone "
                     "(off: x 1)",
    "buffer_broadcast": "DDP's broadcast of the model's buffers at each forward, one collective at the halo fit "
                        "(and out of the reference runs' forward the slowdown is measured on; off: 0)",
    "rank_constant": "more ranks per node: a constant per step beside the slowdown's factor, from the same network "
                     "alone and together at two batches (off: the slowdown one ratio at the reference batch)",
    "probe_drift": "the reference runs corrected by the speed probe for the machine's change of speed since the "
                   "op grid (off: taken as measured)",
    "optimizer_residual": "the optimizer's law + what the reference run's optimizer phase took beyond it (off: the "
                          "law alone)",
    "loop_overheads": "h2d and other as the reference run measured them, and the rank's own loading on the line its "
                      "runs measured (off: 0, and the loader's law alone)",
    "overhead_slope": "the optimizer's residual and other as a constant + a share of the step's forward + backward, "
                      "through refnet's runs at two batches, held at the most compute they had (off: the reference "
                      "run's own)",
    "comm_residual": "exposed communication the bucket model does not explain: a constant + a share of compute, "
                     "from the 2-rank reference runs (off: 0)",
    "comm_slope": "the residual's share of compute (off: its mean as a constant)",
    "comm_range": "the residual's share of compute held at the most compute the reference runs had (off: the line "
                  "extrapolated)",
    "skew_floor": "the residual never under the wait of one collective between computing ranks (the halo fit's "
                  "latency beyond the idle point-to-point's; off: the line alone)",
    "core_stretch": "ranks' threads beyond the cores stretch compute by the threads over the cores (off: no "
                    "stretch)",
    "worker_sharing": "a loader worker's work on the cores a rank's threads fill costs the rank as much compute "
                      "(off: it costs nothing)",
    "loader_handoff": "a loader worker's per-batch hand-over and its first-batch start-up (off: 0)",
    "harness_excess": "each op's isolated time less what timing it alone adds (an autocast context per forward, "
                      "an autograd engine start per backward), measured on a chain of tiny ops (off: as timed)",
    "ddp_copies": "DDP's copy of each gradient into its bucket (in backward) and of the reduced buckets back "
                  "(exposed), by the calibration's host-work law (off: 0)",
    "overlap_cpu": "a bucket reduced beside backward takes its collective's CPU seconds from backward where the "
                   "ranks' threads fill the cores (off: hidden is free)",
    "shared_latency": "another DDP hook's exchange (the ring, a compressor) between computing ranks at the all-reduce's "
                      "latency, which the residual was measured beyond, and its own bytes' rate (off: its idle fit's "
                      "latency too)",
}
"""Every correction the calibration basis stacks on the ops' isolated times, by name: `Predictor(...,
without=...)` leaves the named ones out, so that benchmarks/corrections.py shows what each one is worth on
recorded runs (docs/predict.md, "What each correction is worth")."""


def check_corrections(names) -> frozenset[str]:
    unknown = sorted(set(names) - set(CORRECTIONS))
    if unknown:
        raise UserError(f"no correction named {', '.join(unknown)}: the corrections are {', '.join(CORRECTIONS)}")
    return frozenset(names)


HOST_COLUMNS = ("tensors", "numel", "extra_numel")  # what a host-work law is linear in (Predictor.host_law)


class Predictor:
    """Everything one calibration predicts with, cached per precision and threads."""

    hardware = None  # the calibration basis: predict/datasheet.py is the other

    def __init__(self, calibration: dict[str, Any], network: dict[str, Any],
                 probe: dict[str, Any] | None = None, without: frozenset[str] = frozenset(), shapes=None) -> None:
        self.cal, self.network = calibration, network
        self.probe = probe  # probe.speed_now()'s result, or None
        self.shapes = shapes  # predict/shapes.OpShapes: the points' shapes the grid lacks, timed here; or None
        self.without = check_corrections(without)  # CORRECTIONS left out (an ablation)
        self._times: dict[tuple[str, int, bool], LayerTimes] = {}
        self._loops: dict[int, M.Loop] = {}
        self._costs: dict[tuple, tuple[Workload, list[M.OpCost]]] = {}  # op_costs by workload (held: ids stay its)
        self._refs: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}  # _reference by run (held, as above)
        self._peaks: dict[str, float | None] = {}
        self.notes: list[str] = []

    @property
    def cores(self) -> int:
        return self.cal["device"]["cores"]

    def peak_flops(self, precision: str) -> float | None:
        """The fastest conv or matmul rate the calibration measured at this precision (FLOP/s, forward or
        backward), over its thread counts: what a plausible prediction stays under (None without such rows)."""
        if precision not in self._peaks:
            self._peaks[precision] = self._peak_flops(precision)
        return self._peaks[precision]

    def _peak_flops(self, precision: str) -> float | None:
        rates = []
        for r in self.cal["layers"]:
            if r["precision"] == precision and r["kind"] in ("conv", "linear"):
                flops = 2 * work(r["kind"], r["features"])
                back = flops * (1 + r["features"].get("grad_in", 1))
                rates += [flops / r["forward_s"]] if r["forward_s"] > 0 else []
                rates += [back / r["backward_s"]] if r.get("backward_s", 0) > 0 else []
        return max(rates, default=None)

    def device_memory(self) -> int | None:
        return self.cal["device"].get("memory_bytes")

    def memory_kind(self) -> str:
        return "cuda" if self.cal["device"]["type"] == "cuda" else "rss"

    # ---------------------------------------------------------------- calibrated laws
    def times(self, precision: str, threads: int, grid_only: bool = False) -> LayerTimes:
        """The calibration's laws and rows at `precision` and the calibrated thread count nearest `threads`, with
        the shapes timed here (self.shapes) unless `grid_only`."""
        t = nearest_threads(self.cal, threads)
        key = (precision, t, grid_only)
        if key not in self._times:
            if precision not in self.cal["precisions"]:
                raise UserError(f"the calibration has no {precision} measurements (it has "
                                f"{', '.join(self.cal['precisions'])}): calibrate without --quick, or predict "
                                f"--precision {self.cal['precisions'][0]}")
            cache = (self.cal.get("created"), self.cal["device"].get("name"), len(self.cal["layers"]), precision, t)
            if cache not in _LAWS:  # fitting takes seconds: once per calibration, precision and thread count
                rows = [r for r in self.cal["layers"] if r["precision"] == precision and r["threads"] == t]
                _LAWS[cache] = LayerTimes(rows, self.cal.get("fits"))
            lt = _LAWS[cache]
            if self.shapes is not None and not grid_only:  # this prediction's own copy: its timed shapes join it
                lt = lt.with_rows(self.shapes.known(precision, t))
            self._times[key] = lt
        return self._times[key]

    def regression_errors(self) -> dict[str, Any]:
        out = {}
        for (prec, t, _), lt in sorted(self._times.items()):
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

    def host_law(self, key: str, column: str, threads: int, match: dict[str, Any]):
        """A strategy's host work (calibrate's `host_work[key]` rows, Strategy.host_work) as a law: seconds of
        `column` = a + b tensors + c values (+ d extra values where the rows have them), fitted (non-negative least
        squares on the relative error: the rows span three orders of magnitude, and the largest set's, out of the
        caches, would set the slope for all) over the rows at the calibrated thread count nearest `threads` that
        `match` (falling back to sgd's where an optimizer has none), scaled to the machine's speed now. None where
        the calibration has no such rows (made before 2026-11-28)."""
        t = nearest_threads(self.cal, threads)
        rows = [r for r in (self.cal.get("host_work") or {}).get(key, []) if r["threads"] == t and column in r]
        mine = [r for r in rows if all(r.get(k) == v for k, v in match.items())] or \
            [r for r in rows if all(r.get(k) == ("sgd" if k == "optimizer" else v) for k, v in match.items())]
        if not mine:
            note = f"the calibration has no timing of the {key} strategy's own host work (made before 2026-11-28): " \
                   "it is not priced; calibrate again (`scaletrain calibrate`) to price it"
            if note not in self.notes:
                self.notes.append(note)
            return None
        from scipy.optimize import nnls

        cols = [c for c in HOST_COLUMNS if c in mine[0]]
        y = np.array([max(r[column], 1e-9) for r in mine])
        coef, _ = nnls(np.array([[1.0, *(r[c] for c in cols)] for r in mine]) / y[:, None], np.ones(len(mine)))
        k = self.speed(threads)

        def seconds(tensors: int, numel: int, extra_numel: int = 0) -> float:
            given = {"tensors": tensors, "numel": numel, "extra_numel": extra_numel}
            return k * float(coef[0] + sum(c * given[name] for c, name in zip(coef[1:], cols)))
        return seconds

    def loader_sample_s(self, dataset: str, image_size: int, source_pixels: int | None, batch: int = 32) -> float:
        """Loader seconds per sample (read, decode, transform, collate, and its share of the batch's own cost)."""
        fit = self.cal["loader"]["fit"]
        kind = dataset.split(":", 1)[0]
        a, b, c, *d = fit.get(kind, fit.get("synthetic", [0.0, 0.0, 0.0]))
        return a + b * (source_pixels or image_size * image_size) + c * image_size * image_size + \
            (d[0] / max(1, batch) if d else 0.0)

    def workers(self) -> W.Workers:
        """A rank's loader workers as the calibration's rows measured them beside an idle rank: a worker's
        per-batch work beyond the same batches' in-process cost, the rank's taking of a made batch (older
        calibrations: the hand-over), two workers' rate over one's, and the first batch's start-up."""
        rows = self.cal["loader"]["workers"]
        if not rows or "loader_handoff" in self.without:
            return W.Workers(sharing="worker_sharing" not in self.without)
        sample_s_64 = self.loader_sample_s("imagefolder", 64, 64 * 64)
        r1 = next((r for r in rows if r["workers"] == 1), rows[0])
        r2 = next((r for r in rows if r["workers"] == 2), None)
        # measured against the same batches made in process, alternated (older calibrations: against the law)
        handoff = r1.get("handoff_s", max(0.0, r1["per_batch_s"] - r1["batch_size"] * sample_s_64))
        startup = max(0.0, statistics.fmean(r["first_batch_s"] for r in rows) - r1["batch_size"] * sample_s_64)
        pair = min(2.0, max(1.0, r1["per_batch_s"] / r2["per_batch_s"])) if r2 else 2.0
        return W.Workers(handoff_s=handoff, receive_s=r1.get("receive_s", handoff), pair_speedup=pair,
                         startup_s=startup, sharing="worker_sharing" not in self.without)

    def batch_copy_s(self, nbytes: int) -> float:
        """The batch's copy to the device beyond the loop's `h2d`: none (the reference runs' own copy is the
        loop's `h2d`, measured on the machine calibrated)."""
        return 0.0

    def loop(self, local_ranks: int) -> M.Loop:
        """What the training loop adds, from the calibration's reference runs (docs/predict.md).

        Forward and backward on one rank: each reference network's measured phase against its ops'
        calibrated sums, split by group (kinds.GROUP), fitted (non-negative least squares over the
        networks) to one factor for compute-bound and one for memory-bound ops: what a real step adds to
        isolated ops (the loop and profiler, caches colder than for an op repeated alone). With one network
        only, one factor for both. More ranks per node: both factors scaled by how much slower the mixed
        reference network ran there than the same network, batch and threads on one rank (ranks sharing
        the memory bus and caches), and where it ran that network alone and together at two batches, a factor
        and a constant per step through both (rank_constant), DDP's broadcast of its buffers taken out first
        (priced apart: broadcast_apart); a calibration without the one-rank run: than the one-rank factors
        predict from its ops timed at that many threads. Every run is corrected by the speed probe for a change
        of the machine's speed between the op grid and the runs. `optimizer` gains what the run's optimizer
        phase took beyond its law; `h2d` and `other` are the run's. On several ranks, the exposed
        communication the bucket model does not explain is added: a constant and a share of the step's
        compute when the calibration ran two batch sizes on that many ranks (ranks drift out of step in
        proportion to their work), a constant otherwise."""
        batch = self.cal["loop"]["batch_size"]
        runs = self._loop_runs()
        if not runs:
            self.notes.append("the calibration has no training-loop run: forward and backward are the ops' sums")
            return M.Loop()
        nproc = min(runs, key=lambda n: (abs(math.log(n / max(1, local_ranks))), -n))
        if nproc not in self._loops:
            # the networks' factors at the thread count they all ran at (the one-thread refnet run is there
            # for the slowdown ratio below, not to weigh refnet twice at another thread count); with the terms each
            # op adds (op_overhead), over every one-rank run: refnet alone at two batches is what separates them
            top = max((r.get("threads") or 1) for r in runs[min(runs)])
            base = self._group_factors([r for r in runs[min(runs)]
                                        if self.op_terms or (r.get("threads") or 1) == top])
            main = min((r for r in runs[nproc] if r.get("model", "refnet") == "refnet"),
                       key=lambda r: abs(r.get("batch_size", batch) - batch), default=runs[nproc][0])
            mine = self._reference(main)
            ph = main["phases_mean_s"]
            scale = {"forward": 1.0, "backward": 1.0}
            extra = {"forward": 0.0, "backward": 0.0}
            alone = self._alone(runs, main) if nproc != min(runs) else None
            # DDP's broadcast of refnet's buffers at each forward is priced apart (pricing.buffer_broadcast_s): out
            # of the forwards the slowdown is measured on
            bcast = self._refnet_broadcast_s(nproc) if nproc > 1 and self.broadcast_apart else 0.0
            if "rank_slowdown" in self.without:
                pass
            elif alone is not None:  # the same network, batch and threads per rank on one rank: the ratio alone
                scale = {d: _slowdown(_less_forward(main, bcast), alone, d) for d in scale}
                pairs = [(_less_forward(r, bcast), self._alone(runs, r)) for r in runs[nproc]
                         if r.get("model", "refnet") == "refnet"]
                pairs = [(many, one) for many, one in pairs if one is not None]
                if "rank_constant" not in self.without:  # two batches alone and together: a factor and a constant
                    for d in scale:
                        scale[d], extra[d] = _slowdown_line(pairs, d) or (scale[d], 0.0)
            elif nproc != min(runs):  # an older calibration: against what the one-rank factors predict
                measured = _less_forward(main, bcast)["phases_mean_s"]
                for d in scale:
                    predicted = _factored(base[d], mine[d])
                    scale[d] = measured[d] * mine["drift"] / predicted if predicted else 1.0
            if "loop_factors" in self.without:
                base = {d: (1.0, 1.0, 0.0, 0.0) for d in ("forward", "backward")}
            off = self.without
            loop = M.Loop(forward=base["forward"][0] * scale["forward"],
                          backward=base["backward"][0] * scale["backward"],
                          forward_memory=base["forward"][1] * scale["forward"],
                          backward_memory=base["backward"][1] * scale["backward"],
                          per_op=(base["forward"][2] * scale["forward"], base["backward"][2] * scale["backward"]),
                          per_cold_byte=(base["forward"][3] * scale["forward"],
                                         base["backward"][3] * scale["backward"]),
                          optimizer_s=0.0 if "optimizer_residual" in off else
                          max(0.0, ph["optimizer"] - mine["optimizer_law_s"]),
                          h2d_s=0.0 if "loop_overheads" in off else ph["h2d"],
                          other_s=0.0 if "loop_overheads" in off else ph["other"],
                          forward_s=extra["forward"], backward_s=extra["backward"])
            if self.lines_apart:
                if "loop_overheads" not in off:
                    loop.data_factor, loop.data_s = self._data_line(runs[nproc]) or (1.0, 0.0)
                if "overhead_slope" not in off:
                    self._overhead_lines(loop, runs[nproc])
            if nproc > 1 and "comm_residual" not in off:
                points = [point for r in runs[nproc] if r.get("model", "refnet") == "refnet"
                          for point in self._comm_points(r)]
                loop.comm_s, loop.comm_per_compute = _affine(points)
                loop.comm_compute_upto_s = max(x for x, _ in points)
                if "comm_slope" in off:
                    loop.comm_s, loop.comm_per_compute = statistics.fmean(y for _, y in points), 0.0
            self._loops[nproc] = loop
        return self._loops[nproc]

    def _overhead_lines(self, loop: M.Loop, runs: list[dict[str, Any]]) -> None:
        """`loop`'s optimizer residual and `other` as lines in the step's forward + backward, through refnet's runs at
        this many ranks (no workers): a short step finds the parameters, gradients and the loop's own state in cache,
        a long one does not. refnet alone: the optimizer 0.33 ms beyond its law at batch 2 (7.6 ms of compute), 0.56
        at 32 (90 ms), `other` 0.39 and 0.46 (2026-11-29), where one constant from batch 32 priced LeNet-5's 4-ms
        steps 0.3-0.4 ms of optimizer too much (its one-rank speedups 10-13% optimistic). Held at the most compute
        fitted over; each line's constant and slope never negative. The constants as they are with one batch."""
        points = [(r["phases_mean_s"]["forward"] + r["phases_mean_s"]["backward"], r) for r in _refnet(runs)]
        if len({r.get("batch_size") for _, r in points}) < 2:
            return
        off = self.without
        if "optimizer_residual" not in off:
            loop.optimizer_s, loop.optimizer_per_compute = _affine(
                [(x, max(0.0, r["phases_mean_s"]["optimizer"] - self._reference(r)["optimizer_law_s"]))
                 for x, r in points])
        if "loop_overheads" not in off:
            loop.other_s, loop.other_per_compute = _affine([(x, r["phases_mean_s"]["other"]) for x, r in points])
        loop.overheads_upto_s = max(x for x, _ in points)

    def _data_line(self, runs: list[dict[str, Any]]) -> tuple[float, float] | None:
        """(factor, seconds per step) of the rank's own loading inside a step against the loader's law for its batch:
        a line through refnet's runs at this many ranks (no workers) at two or more batches, as their `data_wait`
        measured it. The loop fetches each batch through the data loader's iterator and loads it with caches the
        step left cold: 1.14x the law + 0.14 ms a step on one rank, 1.16x + 0.15 ms on two (2026-11-29), where the
        law alone put the held-out models' wait 13-31% low at batch 32 and 64. None with one batch (older
        calibrations: the law alone), or where the line is not one (a negative constant, a factor under 0.5)."""
        points = {}
        for r in _refnet(runs):
            if r.get("dataset", "synthetic") != "synthetic":
                continue
            batch = r.get("batch_size", self.cal["loop"]["batch_size"])
            law = batch * self.loader_sample_s("synthetic", self.cal["loop"]["image_size"], None, batch)
            points.setdefault(batch, []).append((law, r["phases_mean_s"]["data_wait"]))
        if len(points) < 2:
            return None
        xs = [x for rows in points.values() for x, _ in rows]
        ys = [y for rows in points.values() for _, y in rows]
        fit = statistics.linear_regression(xs, ys)
        if fit.slope < 0.5 or fit.intercept < 0:
            return None
        return fit.slope, fit.intercept

    @functools.cached_property
    def lines_apart(self) -> bool:
        """Whether the calibration ran refnet alone at two batches or more (since 2026-11-29): the loop's lines in the
        batch and the step's compute (_data_line, _overhead_lines) are fitted at any rank count only then. A
        calibration with one batch alone and two together would move the many-rank step alone, and every speedup
        with it (recorded: the held-out ratios' p90 16.4 -> 20.5%, an MLP's 44 -> 53%)."""
        runs = self._loop_runs()
        return bool(runs) and len({r.get("batch_size") for r in _refnet(runs[min(runs)])}) >= 2

    @functools.cached_property
    def broadcast_apart(self) -> bool:
        """Whether DDP's broadcast of a model's buffers at each forward is priced apart (pricing.buffer_broadcast_s):
        where the calibration ran refnet alone and on more ranks at two batches (since 2026-11-29), which separate
        the slowdown's factor, its constant per step and the broadcast. One batch cannot: an older calibration keeps
        refnet's broadcast inside its one ratio (priced apart there, it left LeNet-5's speedups 1-2 points worse)."""
        runs = self._loop_runs()
        return any(len({r.get("batch_size") for r in many if r.get("model", "refnet") == "refnet"
                        and self._alone(runs, r) is not None}) >= 2 for n, many in runs.items() if n > 1)

    def _loop_runs(self) -> dict[int, list[dict[str, Any]]]:
        """The calibration's training-loop runs that completed, without loader workers, by ranks."""
        runs: dict[int, list[dict[str, Any]]] = {}
        for r in self.cal.get("loop", {}).get("runs", []):
            if "error" not in r and r.get("phases_mean_s") and not r.get("workers"):
                runs.setdefault(r["nproc"], []).append(r)
        return runs

    def _refnet_broadcast_s(self, nproc: int) -> float:
        """What DDP's broadcast of refnet's buffers costs a forward on `nproc` ranks of one node, priced as a
        strategy prices it for any model (pricing.buffer_broadcast_s)."""
        from scaletrain.predict.pricing import buffer_broadcast_s

        cal = self.cal["loop"]
        nbytes = _reference_workload("refnet", cal["image_size"], cal["batch_size"]).buffer_bytes
        return buffer_broadcast_s(M.Setting(batch_size=1, nproc=nproc, buffer_bytes=nbytes), self.network, self.without)

    @staticmethod
    def _alone(runs: dict[int, list[dict[str, Any]]], main: dict[str, Any]) -> dict[str, Any] | None:
        """The one-rank run of `main`'s network at its batch and threads per rank, if the calibration has one:
        the many-rank run over it is how much slower a rank computes when the other ranks fill the cores."""
        return next((r for r in runs.get(1, []) if r.get("model", "refnet") == main.get("model", "refnet")
                     and r.get("batch_size") == main.get("batch_size") and r.get("threads") == main.get("threads")),
                    None)

    @functools.cached_property
    def op_terms(self) -> bool:
        """Whether the loop adds a constant and a cold fetch to each op (op_overhead): where the calibration ran refnet
        alone at two batches (lines_apart), whose tiny ops and large ones tell the terms from the factors."""
        return self.lines_apart and not {"op_overhead", "loop_factors"} & self.without

    def _group_factors(self, runs: list[dict[str, Any]]) -> dict[str, tuple[float, float, float, float]]:
        """{direction: (compute factor, memory factor, seconds per op, seconds per cold byte)} from the one-rank runs
        of the reference networks: non-negative least squares of each run's phase over its ops' sums per group, and
        with op_terms over its count of ops and their cold bytes. refnet alone at one thread, 2026-11-29: the
        factors alone left its batch-2 forward 16-21% above them and the held-out LeNet-5 (ops of 0.1-0.3 ms)
        13-17% under where ResNet-20's convolutions came within 4-10%; each op a step fetches cold up to its
        cores' L2 (1 MiB here) and a constant per op brought the four calibrations' ResNet-20-over-LeNet-5 ratios of
        forward + backward from 5-11% over to -0.3..+8%."""
        from scipy.optimize import nnls

        refs = [(self._reference(r), r["phases_mean_s"]) for r in runs]
        terms = self.op_terms
        out = {}
        for d in ("forward", "backward"):
            y = np.array([ph[d] * ref["drift"] for ref, ph in refs])
            sums = np.array([ref[d]["compute"] + ref[d]["memory"] for ref, _ in refs])
            single = float(y.sum() / sums.sum()) if sums.sum() > 0 else 1.0
            grouped = len({r.get("model", "refnet") for r in runs}) >= 2 and "group_factors" not in self.without
            cols = [[ref[d]["compute"], ref[d]["memory"]] if grouped else [ref[d]["compute"] + ref[d]["memory"]]
                    for ref, _ in refs]
            if terms:  # per op in ms, per cold byte in s/GB: columns of one scale for the solver
                cols = [c + [ref[d]["ops"] * 1e-3, ref[d]["cold_bytes"] * 1e-9] for c, (ref, _) in zip(cols, refs)]
            if not grouped and not terms:
                out[d] = (single, single, 0.0, 0.0)
                continue
            coef, _ = nnls(np.array(cols), y)
            factors, added = list(coef[:2 if grouped else 1]), list(coef[len(coef) - 2:] if terms else (0.0, 0.0))
            if min(factors) <= 0:
                out[d] = (single, single, 0.0, 0.0)
                continue
            # three noisy runs can pull the fit far (a memory factor of 6 when one run ran slow): each
            # group's factor is held within GROUP_BOUND of the pooled one
            lo, hi = (single / GROUP_BOUND, single * GROUP_BOUND) if "group_bound" not in self.without else (0, math.inf)
            fc, fm = (float(min(hi, max(lo, c))) for c in (factors if grouped else factors * 2))
            out[d] = (fc, fm, float(added[0]) * 1e-3, float(added[1]) * 1e-9)
        return out

    def _loop_drift(self, threads: int) -> float:
        """The probe along the op grid over the probe around the loop runs (1 without probes): a loop run
        on a machine running 10% slower than during the grid has its factor taken down by that."""
        pr = self.cal.get("probe") or {}
        t = str(nearest_threads(self.cal, threads))
        grid, loop = (pr.get("mean_s") or {}).get(t), (pr.get("loop_mean_s") or {}).get(t)
        return grid / loop if grid and loop and "probe_drift" not in self.without else 1.0

    def _comm_points(self, run: dict[str, Any]) -> list[tuple[float, float]]:
        """(forward + backward, exposed communication beyond the bucket model) of each of the run's repeats
        (one run's exposed communication moves 25% from the next's: every repeat weighs in the line), or of
        their medians for a calibration that kept no repeats."""
        plain = self._plain_comm(run)
        each = [ph for ph in run.get("phases_runs_s") or [] if ph] or [run["phases_mean_s"]]
        return [(ph["forward"] + ph["backward"], max(0.0, ph["comm_exposed"] - plain)) for ph in each]

    def _plain_comm(self, run: dict[str, Any]) -> float:
        """The exposed communication the bucket model alone gives the reference run (with DDP's copies back, where
        the calibration timed them: what the residual is beyond)."""
        ref = self._reference(run)
        s = M.Setting(batch_size=run.get("batch_size", self.cal["loop"]["batch_size"]), nproc=run["nproc"],
                      cores=self.cal["device"]["cores"], threads=ref["threads"])
        step = M.predict_step(ref["ops"], s, M.Loop(), self.network, lambda t, n: 0.0, predictor=self)
        return step["phases_s"]["comm_exposed"] - step["comm"].get("residual_s", 0.0)  # (the skew floor's, if any)

    def _reference(self, run: dict[str, Any]) -> dict[str, Any]:
        """A reference run's ops (calibrated, as when measured: their shapes are in the grid), their sums per
        direction and group (the loss with the memory-bound ops), the optimizer's law and the probe drift."""
        held = self._refs.get(id(run))
        if held is None or held[0] is not run:
            held = self._refs[id(run)] = (run, self._reference_of(run))
        return held[1]

    def _reference_of(self, run: dict[str, Any]) -> dict[str, Any]:
        cal = self.cal["loop"]
        batch = run.get("batch_size", cal["batch_size"])
        ref = _reference_workload(run.get("model", "refnet"), cal["image_size"], batch)
        threads = run.get("threads") or 1
        ops = self.op_costs(ref, "fp32", threads, now=False, time_shapes=False)
        loss = self.loss_s(batch, 10, "fp32", threads, now=False)
        sums = {}
        for i, d in enumerate(("forward", "backward")):
            compute = sum(getattr(o, f"{d}_s") for o in ops if o.group == "compute")
            timed = [o for o in ops if getattr(o, f"{d}_s") > 0]
            sums[d] = {"compute": compute, "memory": sum(getattr(o, f"{d}_s") for o in ops) - compute + loss[i],
                       "ops": len(timed), "cold_bytes": sum(o.cold_bytes[i] for o in timed)}
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

    def op_costs(self, workload: Workload, precision: str, threads: int, now: bool = True,
                 time_shapes: bool = True) -> list[M.OpCost]:
        """The ops' calibrated costs; `time_shapes`: with the shapes the grid lacks timed here first (self.shapes);
        a reference network's are priced by the calibration's own rows, which the loop factors were fitted on.
        Kept per workload: a plan prices one workload at many settings."""
        key = (id(workload), precision, threads, now, time_shapes)
        held = self._costs.get(key)
        if held is None or held[0] is not workload:
            held = self._costs[key] = (workload, self._op_costs(workload, precision, threads, now, time_shapes))
        return held[1]

    def _op_costs(self, workload: Workload, precision: str, threads: int, now: bool,
                  time_shapes: bool) -> list[M.OpCost]:
        lt = self.times(precision, threads, grid_only=not time_shapes)
        if self.shapes is not None and time_shapes:
            self.shapes.time_missing(lt, workload.ops, precision, nearest_threads(self.cal, threads))
        k = self.speed(threads) if now else 1.0
        costs = []
        cold = self._cold_bytes(precision, threads)
        for op in workload.ops:
            grads = [4 * n for n in op.param_numels]
            if op.kind == "view":
                costs.append(M.OpCost(0.0, 0.0, grads, "none", "memory", kind=op.kind))
                continue
            # a calibration made before average pooling was its own kind (2026-11-26) prices it as max pooling
            kind = "pool" if op.kind == "avgpool" and not lt.has("avgpool") else op.kind
            fwd, bwd, source = lt.times(kind, op.features)
            fwd, bwd = self.in_chain(fwd, bwd, threads)
            fetched = cold(op)
            if op.backward_only:  # a sum of gradients: one element-wise add each, in backward
                costs.append(M.OpCost(0.0, k * fwd, grads, source, GROUP[op.kind], cold_bytes=(0.0, fetched[0]),
                                      kind=op.kind))
                continue
            costs.append(M.OpCost(k * fwd, k * bwd, grads, source, GROUP[op.kind], cold_bytes=fetched, kind=op.kind))
        return costs

    def _cold_bytes(self, precision: str, threads: int):
        """op -> (forward, backward) bytes a step brings it cold that its isolated timing found in its cores' L2
        (predict/l2.py); none on an accelerator, whose loop is fitted with its constant per op alone."""
        from scaletrain.predict import l2
        from scaletrain.predict.datasheet import op_bytes

        if self.memory_kind() == "cuda":
            return lambda op: (0.0, 0.0)
        size = self.cal["device"].get("l2_bytes") or l2.l2_bytes()
        return lambda op: tuple(l2.cold_bytes(b, threads, size) for b in op_bytes(op, precision))

    def in_chain(self, forward_s: float, backward_s: float, threads: int) -> tuple[float, float]:
        """An op's seconds timed alone, as it costs among a step's ops: less what timing it alone adds
        (calibrate's `harness`, timing.harness_excess), never below the tiniest op's cost in a chain nor
        above the time as timed. A calibration made before 2026-11-26 has no `harness`: as timed."""
        h = (self.cal.get("harness") or {}).get(str(nearest_threads(self.cal, threads)))
        if not h or "harness_excess" in self.without:
            return forward_s, backward_s
        return (max(forward_s - h["forward_s"], min(forward_s, h["chain_forward_s"])),
                max(backward_s - h["backward_s"], min(backward_s, h["chain_backward_s"])))

    def fresh_s(self, nbytes: int, cfg) -> float:
        """Seconds the fresh pages of a tensor of `nbytes` made and freed once cost under the allocator policy
        `cfg`'s run takes (distributed/pages.py, as calibrated): 0 below that policy's mmap threshold (the heap's memory
        is reused), on a GPU, or for a calibration made before 2026-11-27 (none measured)."""
        from scaletrain.distributed.allocator import THRESHOLDS, resolved

        if self.memory_kind() == "cuda":
            return 0.0
        policy = resolved(cfg.launch.allocator, bool(cfg.launch.memory_per_device), "cpu")
        pages = ((self.cal.get("memory") or {}).get("fresh_pages") or {}).get(policy)
        if not pages or nbytes < THRESHOLDS[policy][0]:
            return 0.0
        return pages["seconds_per_byte"] * nbytes

    def copy_s(self, nbytes: int, threads: int) -> float:
        """Seconds to copy `nbytes` of fp32 once (a pass over memory): an element-wise op's law at that many
        elements, as it costs in a chain."""
        lt = self.times("fp32", threads)
        f = self.in_chain(*lt.times("eltwise", {"elements": max(1, nbytes // 4), "inputs": 1})[:2], threads)[0]
        return self.speed(threads) * f

    def codec_s(self, numel: int, threads: int) -> float:
        """Seconds of fp16 gradient compression's two casts of `numel` fp32 elements (to half before the exchange,
        back after it): two element-wise passes, by the calibration's element-wise law."""
        f = self.times("fp32", threads).times("eltwise", {"elements": numel, "inputs": 1})[0]
        return 2 * self.speed(threads) * self.in_chain(f, 0.0, threads)[0]

    def loss_s(self, batch: int, classes: int, precision: str, threads: int, now: bool = True) -> tuple[float, float]:
        lt = self.times(precision, threads)
        f, b = self.in_chain(*lt.times("eltwise", {"elements": batch * classes, "inputs": 1})[:2], threads)
        k = self.speed(threads) if now else 1.0
        return 3 * k * f, 3 * k * b  # log-softmax, gather, mean: about three element-wise passes each way


@functools.lru_cache(maxsize=16)
def _reference_workload(name: str, image_size: int, batch: int) -> Workload:
    from scaletrain.predict import refnet

    return cal_workload(refnet.factory(name)(10, 3, image_size), (3, image_size, image_size), batch)


def cal_workload(module, input_shape, batch: int) -> Workload:
    from scaletrain.predict.ops import trace_ops

    return trace_ops(module, tuple(input_shape), batch)


def _factored(base: tuple[float, float, float, float], sums: dict[str, float]) -> float:
    """A reference run's phase as its loop's factors and terms price it (Predictor._group_factors, _reference)."""
    return (base[0] * sums["compute"] + base[1] * sums["memory"] + base[2] * sums["ops"]
            + base[3] * sums["cold_bytes"])


def _refnet(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs of refnet itself (not the plain and memory-bound networks beside it)."""
    return [r for r in runs if r.get("model", "refnet") == "refnet"]


def _affine(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(constant, slope) of y over x by least squares through the (x, y) points, neither negative; points at one
    x only: their mean, a constant."""
    if len(points) < 2 or max(x for x, _ in points) - min(x for x, _ in points) <= 0:
        return statistics.fmean(y for _, y in points), 0.0
    slope = max(0.0, statistics.linear_regression([x for x, _ in points], [y for _, y in points]).slope)
    const = max(0.0, statistics.fmean(y - slope * x for x, y in points))
    return const, slope


def _less_forward(run: dict[str, Any], seconds: float) -> dict[str, Any]:
    """`run` with `seconds` taken off the forward of its medians and of each of its rounds."""
    if not seconds:
        return run

    def less(ph):
        return {**ph, "forward": max(0.0, ph["forward"] - seconds)} if ph else ph
    return {**run, "phases_mean_s": less(run["phases_mean_s"]),
            "phases_runs_s": [less(ph) for ph in run.get("phases_runs_s") or []]}


def _slowdown_line(pairs: list[tuple[dict[str, Any], dict[str, Any]]], phase: str) -> tuple[float, float] | None:
    """(factor, constant) of `phase` on many ranks against the same network alone at two or more batches: many =
    factor x alone + constant, through each batch's slowdown (`_slowdown`, its rounds paired) as factor + constant /
    alone. A step's forward on two ranks pays a constant beside the factor (DDP's wrapper, and a rank's compute
    runs slower after a gloo all-reduce: LeNet-5's 2-ms forward 15% after one of 0.25 MB, ResNet-20's 54-ms forward
    1%; 2026-11-29), which a ratio taken at one batch spreads over every op. None with fewer than two batches, or
    where the line is not a slowdown (a negative constant, a factor under 0.5: noise larger than the effect)."""
    points = {}
    for many, alone in pairs:
        a = alone["phases_mean_s"][phase]
        if a > 0:
            points[alone.get("batch_size")] = (1.0 / a, _slowdown(many, alone, phase))
    xs, ys = zip(*points.values()) if points else ((), ())
    if len(set(xs)) < 2:
        return None
    fit = statistics.linear_regression(xs, ys)
    if fit.slope < 0 or fit.intercept < 0.5:
        return None
    return fit.intercept, fit.slope


def _slowdown(many: dict[str, Any], alone: dict[str, Any], phase: str) -> float:
    """How much slower `phase` ran on many ranks than alone: the geometric mean of the rounds' ratios where
    the calibration ran the two alternately (round k with round k: the drift between rounds cancels), else
    the ratio of the two medians (older calibrations)."""
    pairs = [(m[phase], a[phase]) for m, a in zip(many.get("phases_runs_s") or [], alone.get("phases_runs_s") or [])
             if m and a and m[phase] > 0 and a[phase] > 0]
    if len(pairs) >= 2:
        return math.exp(statistics.fmean(math.log(m / a) for m, a in pairs))
    a = alone["phases_mean_s"][phase]
    return many["phases_mean_s"][phase] / a if a else 1.0
