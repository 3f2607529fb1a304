"""What a step of `--strategy spatial --stages K` costs (comm/spatial/pipeline.py's SpatialPipeline; docs/predict.md,
"Spatial tiles"): the pipeline's pricing (predict/pipeline.py) over blocks whose front runs on a tile.

- the front's blocks (those before the gather, `staged_until`) priced op by op on one tile's shape, the rest on the
  whole image, as the run times its blocks for the split (split/costs.py's `tiles`); a front block's activations
  crossing a cut are the tile's;
- each front block adds its own exchanges, per micro-batch: its window layers' halos (per cut dimension one
  exchange each way, again for a recomputed layer: the halo fit's alpha plus the bytes the geometry says the busiest
  tile sends, times its beta; the forward ones on its forward, the gradients' on its backward) and its BatchNorm
  layers' statistics (an all-reduce of 2 C values over the tiles each way, each waiting for the slower rank: the
  halo fit's latency beyond the idle point-to-point's); the front's last block the gather of the tiles (S - 1
  messages of a tile's output);
- the split the run would choose on those blocks and the schedule played over it; the phases are means over the
  stages, the halos and the gather told apart from forward and backward;
- after backward, each stage's front gradients summed over its tiles (one flat message, the largest stage's) and
  every stage's gradients averaged over the replicas; the optimizer steps the mean stage's parameters.
"""

from __future__ import annotations

import dataclasses

from scaletrain.comm.spatial.cost import (_recomputed, flat_all_reduce_s, gather_seconds, halo_fit, norm_stats_s,
                                         windows)
from scaletrain.comm.spatial.front import halo_bytes_per_sample, plan_front, staged_until, tiled_front
from scaletrain.comm.spatial.geometry import TileGrid, square_grid
from scaletrain.comm.spatial.halo import Tiles
from scaletrain.errors import UserError


def staged_cost(pricing):
    from scaletrain.predict import pipeline as PP
    from scaletrain.predict.pricing import Cost

    s, cfg = pricing.setting, pricing.cfg
    alpha, beta = pricing.link("allreduce")
    pp = PP.kept("spatial-staged", pricing.predictor, cfg, pricing.facts, s.rank_threads, pricing.link("ps"),
                 lambda: _phases(pricing))
    k, m = len(pp["stage_param_bytes"]), cfg.pipeline.microbatches
    replicas = max(1, cfg.layout.replicas)
    exposed = flat_all_reduce_s(pricing, max(pp["stage_front_grad_bytes"]), cfg.spatial.tiles) + \
        PP.replicas_allreduce_s(pp["stage_param_bytes"], replicas, alpha, beta)
    transfers = sum(st["transfer_s"] for st in pp["split"]["stages"]) * m
    comm = {"bytes_per_step": pp["halo_bytes_per_step"], "buckets": 0, "overlap_ratio": None,
            "comm_total_s": transfers + exposed + pp["halo"] + pp["gather"], "comm_hidden_s": 0.0,
            "halo_bytes_per_step": pp["halo_bytes_per_step"]}
    tensors = max(1, len(pricing.grads) // k)
    phases = {name: pp[name] for name in ("forward", "backward", "halo", "gather", "bubble", "p2p")}
    phases["optimizer"] = pricing.optimizer_s(tensors, int(sum(pp["stage_param_bytes"]) / k // 4)) + \
        pricing.loop.optimizer_s
    return Cost(exposed, comm, phases=phases, extra={"pipeline": pp}, flops_share=pp["compute_share"] / k)


def floor_s(cfg, facts: dict, predictor, threads: int) -> float | None:
    """A lower bound on the step staged_cost prices (predict/pipeline.floor_s over the blocks _phases splits, before
    their halos, statistics and gather are added): what a plan prunes by. None where the blocks cannot be priced so
    (the cost then says why)."""
    from scaletrain.predict import pipeline as PP

    grid = TileGrid(*square_grid(cfg.spatial.tiles))
    try:
        model, graph, shape, micro = PP.blocked_model(cfg, facts)
        _, f = staged_until(model, cfg.spatial.until, graph, shape, grid)
        tile_shape = (shape[0], shape[1] // grid.rows, shape[2] // grid.cols)
        on_tile = PP.blocked_at(cfg, facts, tile_shape)
        if on_tile.names != graph.names:
            return None
        front = PP.priced_blocks(predictor, cfg, on_tile, model, tile_shape, micro, threads)[:f]
        whole = PP.priced_blocks(predictor, cfg, graph, model, shape, micro, threads)
    except UserError:
        return None
    return PP.floor_s(cfg, front + whole[f:])


def _phases(pricing) -> dict:
    from scaletrain.predict import pipeline as PP

    cfg, p, threads = pricing.cfg, pricing.predictor, pricing.setting.rank_threads
    tiles = cfg.spatial.tiles
    grid = TileGrid(*square_grid(tiles))
    model, graph, shape, micro = PP.blocked_model(cfg, pricing.facts)
    until, f = staged_until(model, cfg.spatial.until, graph, shape, grid)
    front = plan_front(model, until, grid, shape)
    whole = PP.priced_blocks(p, cfg, graph, model, shape, micro, threads)
    tile_shape = (shape[0], shape[1] // grid.rows, shape[2] // grid.cols)
    on_tile = PP.blocked_at(cfg, pricing.facts, tile_shape)
    if on_tile.names != graph.names:
        raise UserError(f"--strategy spatial --stages {cfg.layout.stages}: {cfg.model.name}'s blocks on a tile are not "
                        "its blocks on the image; measure it with scaletrain train")
    front_costs = PP.priced_blocks(p, cfg, on_tile, model, tile_shape, micro, threads)[:f]
    element = 8 if cfg.model.precision == "fp64" else 4
    recomputed = _recomputed(cfg, model, shape, front)
    layers = tiled_front(model, front, grid, shape)
    every = [Tiles(grid, t, tuple(range(tiles))) for t in range(tiles)]
    h_alpha, h_beta = pricing.link(halo_fit(pricing))
    cuts = (grid.rows > 1) + (grid.cols > 1)
    costs, halo_f, halo_b, sent, gathered = [], 0.0, 0.0, 0, 0.0
    for i, cost in enumerate(front_costs):
        mine = {graph.graph.nodes[n].target for n in graph.blocks[i].nodes}
        part = dataclasses.replace(front, inputs=tuple(x for x in front.inputs if x[0] in mine))
        forward_x = sum(cuts * (1 + recomputed(name)) for name in windows(layers, part))
        backward_x = sum(cuts * (name not in front.on_image) for name in windows(layers, part))
        nbytes = max(halo_bytes_per_sample(layers.__getitem__, part, t, element, recomputed) for t in every) * micro
        # the bytes go each way as the exchanges do (a forward halo and its gradient are of one size)
        fwd_b, bwd_b = (nbytes * x / (forward_x + backward_x) if forward_x + backward_x else 0.0
                        for x in (forward_x, backward_x))
        fh, bh = forward_x * h_alpha + fwd_b * h_beta, backward_x * h_alpha + bwd_b * h_beta
        norm = norm_stats_s(pricing, [layers[n] for n in front.layers if n in mine], tiles, element)
        # the tiles gathered after the front's last block
        gather = gather_seconds(pricing, front, tiles, micro, element) if i == f - 1 else 0.0
        costs.append(dataclasses.replace(cost, forward_s=cost.forward_s + fh + norm + gather,
                                         backward_s=cost.backward_s + bh + norm))
        halo_f, halo_b, sent, gathered = halo_f + fh, halo_b + bh, sent + nbytes, gathered + gather
    costs += whole[f:]
    # a recomputed block runs its compute again in backward (its halos' repeats are in `recomputed` above)
    again = PP.recompute_s(front_costs + whole[f:], PP.recomputed_blocks(cfg, pricing.facts))
    pp = PP.split_phases(cfg, graph, model, shape, costs, pricing.link("ps"), again)
    k, m = len(pp["split"]["stages"]), cfg.pipeline.microbatches
    front_grads = [sum(c.param_bytes for c in costs[lo:min(hi, f)]) for lo, hi in pp["split"]["bounds"]]
    compute = sum(c.forward_s + c.backward_s for c in front_costs) + sum(c.forward_s + c.backward_s for c in whole[f:])
    total = sum(c.forward_s + c.backward_s for c in whole)
    pp.update({
        # the halos and the gather told apart from the stages' compute (means over the stages, as the phases are)
        "forward": pp["forward"] - m * (halo_f + gathered) / k, "backward": pp["backward"] - m * halo_b / k,
        "halo": m * (halo_f + halo_b) / k, "gather": m * gathered / k,
        "halo_bytes_per_step": sent * m, "stage_front_grad_bytes": front_grads, "gather_after_block": f,
        "until": front.until, "compute_share": compute / total if total else 1.0})
    return pp

