"""What a step of `--strategy spatial` costs (predict's seam: Strategy.cost, predict/pricing.py), from the same
geometry the tiles run on (docs/spatial.md, docs/predict.md "Spatial tiles"):

- forward and backward: the front's ops run on 1/S of the pixels, the rest whole on every tile's rank; the
  front's share of each is its ops' calibrated times over the model's (the ops up to the front's last node);
  its BatchNorm layers add one all-reduce of their statistics each way (2 C values over the tiles), each also
  waiting as a halo exchange does for the rank whose compute ran longer (the halo fit's latency beyond the idle
  point-to-point's);
- `halo`: per window layer and cut dimension one exchange each way (again for a recomputed layer), each the
  halo fit's alpha (commbench's `halo`: a swap between neighbours that compute between swaps, their skew
  included) plus the bytes the geometry says this tile sends (the busiest tile's) times its beta;
- `gather`: the front's output all-gathered over the tiles, (S - 1) (alpha + a tile's bytes x beta);
- a fused stem (Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d, plain fp32/fp64) runs its forward again in backward;
- `comm_exposed`: the front's gradients summed over the tiles, then every gradient averaged over the replicas,
  each one flat message: the all-reduce plus the gradients copied in and out (a memory pass each way) and the
  message's fresh pages (made anew each step: distributed/pages.py).
Memory per rank is the one memory model's (SpatialTiles.memory, comm/memory.py).
"""

from __future__ import annotations

import math

import torch

from scaletrain.comm.spatial.front import (checkpointed_units, forward_runs, halo_bytes_per_sample, plan_front,
                                          tiled_front)
from scaletrain.comm.spatial.geometry import TileGrid, square_grid
from scaletrain.comm.spatial.halo import Tiles
from scaletrain.errors import UserError
from scaletrain.perf import alphabeta


def spatial_cost(pricing):
    from scaletrain.predict.points import meta_model_of, model_factory, sample_shape
    from scaletrain.predict.pricing import Cost

    cfg, facts, ops = pricing.cfg, pricing.facts, pricing.ops
    s = cfg.spatial.tiles
    grid = TileGrid(*square_grid(s))
    shape = sample_shape(facts)
    model = meta_model_of(cfg, facts)
    if model is None:
        with torch.device("meta"):
            model = model_factory(cfg, facts)()  # (raises what the model raises on meta)
    front = plan_front(model, cfg.spatial.until, grid, shape)
    names = [o.name for o in ops]
    if front.last not in names:
        raise UserError(f"--strategy spatial: the front's end ({front.until}) is not among the ops predict walked "
                        f"for {cfg.model.name}; measure it with scaletrain train")
    end = names.index(front.last) + 1

    def share(attr: str) -> float:
        total = sum(getattr(o, attr) for o in ops)
        return sum(getattr(o, attr) for o in ops[:end]) / total if total else 0.0

    batch = cfg.optim.batch_size
    element = 8 if cfg.model.precision == "fp64" else 4
    fit = halo_fit(pricing)
    rows = pricing.link(fit)
    recomputed = _recomputed(cfg, model, shape, front)
    layers = tiled_front(model, front, grid, shape)
    every = [Tiles(grid, t, tuple(range(s))) for t in range(s)]
    sent = max(halo_bytes_per_sample(layers.__getitem__, front, t, element, recomputed) for t in every) * batch
    cuts = (grid.rows > 1) + (grid.cols > 1)
    exchanges = sum(cuts * (1 + (name not in front.on_image) + recomputed(name)) for name in windows(layers, front))
    halo_s = exchanges * rows[0] + sent * rows[1]
    norm_s = norm_stats_s(pricing, layers.values(), s, element)
    gather_s = gather_seconds(pricing, front, s, batch, element)
    tile_out = batch * element * math.prod(front.out_shape) // s
    front_grads = sum(g for o in ops[:end] for g in o.grad_bytes)
    exposed = flat_all_reduce_s(pricing, front_grads, s)
    replicas = max(1, cfg.layout.replicas)
    if replicas > 1:
        exposed += flat_all_reduce_s(pricing, sum(pricing.grads), replicas)
    # a fused stem keeps only its input: its forward runs again in its backward, on the tile (comm/spatial/stem.py;
    # under autocast the four layers run one by one and keep their own)
    fused = {name.replace(".", "_") for chain in front.stems for name in chain} \
        if cfg.model.precision in ("fp32", "fp64") else set()
    total_forward = sum(o.forward_s for o in ops)
    stem_again = sum(o.forward_s for o in ops if o.name in fused) / total_forward if total_forward else 0.0
    phases = {"forward": pricing.phases["forward"] * (1 - share("forward_s") * (1 - 1 / s)) + norm_s,
              "backward": pricing.phases["backward"] * (1 - share("backward_s") * (1 - 1 / s)) + norm_s
              + pricing.phases["forward"] * stem_again / s,
              "halo": halo_s, "gather": gather_s}
    comm = {"bytes_per_step": sent + tile_out * (s - 1) + front_grads, "buckets": 0,
            "comm_total_s": halo_s + gather_s + exposed + 2 * norm_s, "comm_hidden_s": 0.0, "overlap_ratio": 0.0,
            "halo_bytes_per_step": sent}
    # a tile computes its 1/S of the front (the front's share of the ops' time standing for its share of the FLOPs)
    return Cost(exposed, comm, phases=phases, flops_share=1 - share("forward_s") * (1 - 1 / s))


def windows(layers: dict, front) -> list[str]:
    """The front's window layers (of `front.inputs`) whose tiled version exchanges halos."""
    return [name for name, _ in front.inputs if any(w for pair in layers[name].widths for w in pair)]


def norm_stats_s(pricing, layers, tiles: int, element: int) -> float:
    """One way's statistics of the tiled BatchNorm layers among `layers`: each an all-reduce of 2 C values over the
    tiles, a collective between ranks that compute between them, so it also waits, as a halo exchange does, for the
    rank whose compute ran longer (the halo fit's latency beyond the idle one's)."""
    alpha, beta = pricing.link("allreduce")
    skew = pricing.skew_s()
    return sum(alphabeta.predict(alpha, beta, tiles, 2 * m.weight.numel() * element) + skew
               for m in layers if type(m).__name__ == "SpatialBatchNorm2d")


def gather_seconds(pricing, front, tiles: int, batch: int, element: int) -> float:
    """The front's output all-gathered over the tiles: (S - 1) messages of a tile's share."""
    alpha, beta = pricing.link("allreduce")
    return (tiles - 1) * (alpha + batch * element * math.prod(front.out_shape) // tiles * beta)


def flat_all_reduce_s(pricing, nbytes: int, ranks: int) -> float:
    """Gradients all-reduced as one flat message over `ranks` (distributed/group.all_reduce_flat): the all-reduce, the
    gradients copied into it and back out, and the message's fresh pages (made anew each step above the allocator's
    threshold)."""
    p, cfg = pricing.predictor, pricing.cfg
    alpha, beta = pricing.link("allreduce")
    return alphabeta.predict(alpha, beta, ranks, nbytes) + 2 * p.copy_s(nbytes, pricing.setting.rank_threads) + \
        p.fresh_s(nbytes, cfg)


NO_HALO_FIT = ("the calibration has no halo fit (commbench's neighbour swap between computing ranks; calibrations "
               "before 2026-11-27): spatial halos are priced at the idle point-to-point latency, several times too "
               "low where ranks share cores (docs/predict.md); calibrate again")


def halo_fit(pricing) -> str:
    """The network fit a halo exchange is priced with: `halo` where the basis has it, else the idle
    point-to-point (`ps`), said in a note."""
    if "halo" in pricing.network.get("intra", {}):
        return "halo"
    if pricing.predictor is not None and getattr(pricing.predictor, "hardware", None) is None:
        pricing.predictor.notes.append(NO_HALO_FIT)
    return "ps"


def _recomputed(cfg, model, shape, front):
    """How many more times a layer's forward runs in backward (its halos then go again): under activation
    checkpointing, and a fused stem's pooling (front.forward_runs)."""
    value = cfg.model.checkpoint_activations
    units = []
    if value not in ("none", "auto"):  # (auto: as resolved by the launcher; priced without the repeat)
        from scaletrain.train.recompute import plan_units

        with torch.device("meta"):
            units = checkpointed_units(plan_units(model, shape, value), front, model)
    return forward_runs(front, units)
