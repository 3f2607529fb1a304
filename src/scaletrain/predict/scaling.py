"""A grid of predicted points and what it says about scaling: speedup and efficiency per point against
its series' smallest, the first limit met as the processes grow, and where efficiency falls under 80%
and 50% (docs/predict.md)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import scaletrain
from scaletrain.errors import UserError
from scaletrain.predict.points import Predictor, check_point, predict_config, trainers

SCALE_KEYS = ("nproc", "nnodes")
LADDER_NODES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def predict_grid(spec, cal: dict[str, Any], network: dict[str, Any], hw, basis: str, *,
                 global_batch: int | None = None, shared_cores: int | None = None, cores: int | None = None,
                 probe: dict[str, Any] | None = None, without: frozenset[str] = frozenset(),
                 progress: Callable[[str, int, int], None] | None = None, shapes=None,
                 predictor=None, prune: Callable[[Any], str | None] | None = None,
                 priced: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every point of the spec predicted; `probe` (probe.speed_now()) scales the calibrated compute;
    `progress(point, done, points)` told after each (a model is traced, one forward pass, per batch size) and as
    `shapes` (predict/shapes.OpShapes: the points' shapes the calibration's grid lacks, timed here) times each;
    `without`: corrections of a calibration basis left out (predictor.CORRECTIONS: an ablation); `predictor`:
    make_predictor's for these arguments, made once for several grids (a plan's); `prune(cfg)`: why a point
    need not be priced (a plan's bound; None: price it), asked before each; `priced(entry)`: told after each."""
    from scaletrain.study.grid import fair_threads, points

    predictor = predictor or make_predictor(cal, network, hw, probe, without, shapes)
    # one thread count for every point unless --threads gives it: cores / the grid's largest nproc, as `study`
    # runs the same flags (so that the speedup over ranks is the ranks' alone, and validate compares like with like)
    spec, _ = fair_threads(spec, cores or predictor.cores)
    grid = points(spec, keep_refused=True)
    out, skipped, pruned = [], [], []
    for i, point in enumerate(grid, 1):
        if shapes is not None and progress is not None:
            # counted in shapes (the first point times nearly all of them: a count of points would stay at 0)
            shapes.tell = lambda n, at=i: progress(f"point {at}/{len(grid)}: op shapes the calibration lacks "
                                                   "timed here", n, None)
        try:
            if point.refused:  # options that do not combine (fp16 with a parameter server): skipped, not fatal
                raise UserError(point.refused)
            if point.dropped:  # e.g. --compress fp16 on a strategy that takes no --compress: the same as another
                from scaletrain.config import applies

                raise UserError(applies.message(point.dropped[0], {**spec.train, **point.axes}))
            cfg = _strong(point.config, global_batch)
            why = prune(cfg) if prune is not None else None
            if why is None:
                r = predict_config(predictor, cfg, shared_cores=shared_cores, cores=cores)
        except UserError as e:  # options that do not combine here: the point is skipped, the grid goes on
            skipped.append({"id": point.id, "axes": point.axes, "reason": str(e)})
            continue
        if why is not None:
            pruned.append({"id": point.id, "axes": point.axes, "reason": why})
        else:
            out.append(_entry(point.id, point.axes, cfg, r))
            if priced is not None:
                priced(out[-1])
        if progress is not None:
            progress(point.id, i, len(grid))
    if not out and not pruned:
        raise UserError(skipped[0]["reason"])
    if not out:  # every point that combines pruned (a plan's bound)
        return {"points": [], "skipped": skipped, "pruned": pruned, "notes": sorted(predictor.notes)}
    _speedups(out, global_batch is not None)
    series = _series(out, global_batch is not None)
    scaling = _scaling(series, predictor, shared_cores or cores, global_batch, network)
    from scaletrain.predict.calibration import unsteady

    shaky = [unsteady(cal)] if hw is None and unsteady(cal) else []
    flags = [f"{p['id']}: {p['plausibility']['flag']}" for p in out if p["plausibility"]["flag"]]
    timed = []
    if shapes is not None:
        shapes.save()
        timed = [shapes.note()] if shapes.note() else []
    notes = sorted({n for p in out for n in p.pop("notes")} | set(predictor.notes) | set(shaky) | set(timed)) + flags
    return {"format": 1, "kind": "prediction", "scaletrain_version": scaletrain.__version__,
            "basis": "datasheet" if hw is not None else "calibration", "basis_note": basis,
            "calibration_device": cal["device"] if cal else None, "hardware": _hardware_facts(hw),
            "network": network, "skipped": skipped, "pruned": pruned,
            "axes": spec.axes, "global_batch": global_batch, "shared_cores": shared_cores, "cores_per_node": cores,
            "regression": predictor.regression_errors(), "speed_probe": probe,
            "corrections_off": sorted(without), "points": out, "scaling": scaling, "notes": notes}


def make_predictor(cal: dict[str, Any] | None, network: dict[str, Any], hw, probe: dict[str, Any] | None = None,
                   without: frozenset[str] = frozenset(), shapes=None):
    """The basis's predictor: a calibration's (Predictor), or a data sheet's (datasheet.DatasheetPredictor,
    which stacks none of a calibration's corrections)."""
    if hw is not None:
        from scaletrain.predict.datasheet import DatasheetPredictor

        if without:
            raise UserError("corrections are a calibration basis's: a data sheet has none to leave out")
        return DatasheetPredictor(hw, network)
    return Predictor(cal, network, probe, without, shapes)


def _hardware_facts(hw) -> dict[str, Any] | None:
    if hw is None:
        return None
    return {"name": hw.name, "source": hw.source, "kind": hw.kind, "count": hw.count,
            "peak_flops": dict(hw.peak_flops), "efficiency": dataclasses.asdict(hw.efficiency)}


def check_grid(spec, hw, global_batch: int | None) -> None:
    """Every point of the spec checked before a calibration is read or a model traced: the global batch
    against every point's trainers, then what points.check_point refuses. A point refused where others
    are not is left to predict_grid, which skips it with its reason; refused when all are."""
    from scaletrain.study.grid import point_name, points

    grid = points(spec, keep_refused=True)
    if all(p.refused for p in grid):
        raise UserError(f"{point_name(grid[0].id, grid[0].axes)}: {grid[0].refused}")
    configs = [p.config for p in grid if not p.refused]
    if global_batch is not None:
        counts = sorted({trainers(c) for c in configs})
        bad = next((t for t in counts if global_batch % t), None)
        if bad is not None:
            step = math.lcm(*counts)
            near = [v for v in (global_batch // step * step, global_batch // step * step + step) if v > 0]
            raise UserError(f"--global-batch {global_batch} does not split evenly over {bad} trainers: give a "
                            f"multiple of {step}, which every point's trainers ({', '.join(map(str, counts))}) "
                            f"divide, such as {' or '.join(map(str, near))}")
    first = None
    for cfg in configs:
        try:
            check_point(_strong(cfg, global_batch), hw)
            return
        except UserError as e:
            first = first or e
    if first is not None:
        raise first


def _strong(cfg, global_batch: int | None):
    """`cfg` with each trainer's share of the global batch (strong scaling); unchanged without one."""
    if global_batch is None:
        return cfg
    n = trainers(cfg)
    if global_batch % n:
        raise UserError(f"--global-batch {global_batch} does not split evenly over {n} trainers: give a multiple "
                        f"of {n}")
    return cfg.replace(batch_size=global_batch // n)


def _entry(pid: str, axes: dict[str, Any], cfg, r: dict[str, Any]) -> dict[str, Any]:
    s = r["setting"]
    config = {k: v for k, v in cfg.to_dict().items() if k not in ("out", "resume", "progress", "stop_after")}
    config.update({"nnodes": cfg.launch.nnodes, "threads": r["threads"], "compress": cfg.strategy.compress or "none",
                   "image_size": r["image_size"]})
    return {"id": pid, "axes": axes, "config": config, "trainers": s.trainers,
            "phases_s": r["phases_s"], "step_time_s": r["step_time_s"], "epoch_time_s": r["epoch_time_s"],
            "steps_per_epoch": r["steps_per_epoch"], "samples_per_s": r["samples_per_s"],
            "speedup": None, "ideal_speedup": None, "efficiency": None,
            "peak_memory_bytes": r["peak_memory_bytes"], "memory_bytes": r["memory_bytes"],
            "memory_kind": r["memory_kind"], "comm": r["comm"], "layers": r["layers"], "ops": r["ops"],
            "limit": r["limit"], "limit_note": r["limit_note"], "batch_efficiency": r["batch_efficiency"],
            "core_sharing_stretch": r["stretch"], "plausibility": r["plausibility"], "notes": r["notes"],
            **{k: r[k] for k in r if k not in _ENTRY_KEYS}}


_ENTRY_KEYS = {"setting", "phases_s", "step_time_s", "epoch_time_s", "steps_per_epoch", "samples_per_s",
               "peak_memory_bytes", "memory_bytes", "memory_kind", "comm", "layers", "ops", "limit", "limit_note",
               "batch_efficiency", "stretch", "plausibility", "notes", "threads", "image_size"}
"""predict_config's keys that _entry places itself: any other is a strategy's own (a pipeline's `pipeline`)."""


def _group_key(p: dict[str, Any], strong: bool) -> tuple:
    skip = set(SCALE_KEYS) | ({"batch_size"} if strong else set())
    return tuple(sorted((k, str(v)) for k, v in p["axes"].items() if k not in skip))


def _series(points: list[dict[str, Any]], strong: bool) -> dict[tuple, list[dict[str, Any]]]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for p in points:
        groups.setdefault(_group_key(p, strong), []).append(p)
    return {k: sorted(v, key=lambda p: p["trainers"]) for k, v in groups.items()}


def _speedups(points: list[dict[str, Any]], strong: bool) -> None:
    for series in _series(points, strong).values():
        base = series[0]
        for p in series:
            p["speedup"] = p["samples_per_s"] / base["samples_per_s"]
            p["ideal_speedup"] = p["trainers"] / base["trainers"]
            p["efficiency"] = p["speedup"] / p["ideal_speedup"]
            p["baseline"] = base["id"]


def _scaling(series: dict[tuple, list[dict[str, Any]]], predictor: Predictor, shared_cores, global_batch,
             network) -> dict[str, Any]:
    """Over the first series: the first limit met as P grows and the P where efficiency falls under 80% and
    50%; beyond the grid, nodes are doubled (at its largest nproc) while a link between nodes is known."""
    first = next(iter(series.values()))
    ladder = [(p["trainers"], p["efficiency"], p["limit"]) for p in first]
    notes = []
    if network.get("inter") and len(ladder) and shared_cores is None:
        from scaletrain.config import build_config

        top = first[-1]
        base_cfg = {k: v for k, v in top["config"].items() if k not in ("threads",)}
        if base_cfg.get("compress") == "none":
            base_cfg["compress"] = None
        base = first[0]
        for nodes in LADDER_NODES:
            if nodes <= top["config"]["nnodes"]:
                continue
            try:
                cfg = _strong(build_config({}, {**base_cfg, "nnodes": nodes}), global_batch)
                r = predict_config(predictor, cfg)
            except UserError:
                break
            trainers = r["setting"].trainers
            speed = r["samples_per_s"] / base["samples_per_s"]
            ladder.append((trainers, speed / (trainers / base["trainers"]), r["limit"]))
        notes.append(f"beyond the grid: {top['config']['nproc']} processes per node, nodes doubled up to "
                     f"{LADDER_NODES[-1]} over {network['source']}")
    first_limit = next(((p, lim) for p, _, lim in ladder if lim != "compute"), None)
    below80 = next((p for p, e, _ in ladder if e is not None and e < 0.8), None)
    below50 = next((p for p, e, _ in ladder if e is not None and e < 0.5), None)
    words = []
    if first_limit:
        words.append(f"first limit as P grows: {first_limit[1]} (from P = {first_limit[0]})")
    else:
        words.append(f"compute-bound up to P = {ladder[-1][0]}: no other limit met")
    words.append(f"efficiency under 80% from P = {below80}" if below80 else
                 f"efficiency stays at or above 80% up to P = {ladder[-1][0]}")
    words.append(f"efficiency under 50% from P = {below50}" if below50 else
                 f"efficiency stays at or above 50% up to P = {ladder[-1][0]}")
    return {"first_limit": first_limit[1] if first_limit else None,
            "first_limit_at": first_limit[0] if first_limit else None,
            "efficiency_below_80_at": below80, "efficiency_below_50_at": below50,
            "ladder": [{"trainers": p, "efficiency": e, "limit": lim} for p, e, lim in ladder],
            "notes": words + notes}
